//! Why an LU or a path did not succeed, kept as data until a front end shows it: the engine's
//! words and, when a command failed, that command's [`CommandError`]. The engine never advises;
//! each front end adds its own advice (`engine::hints`) at its edge, with [`Failure::advise`] and
//! the reports' `advise`, so one report reads in `prfence`'s, fence_pr's or the agent's terms.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::transport::{CommandError, ErrorKind, Hints};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The engine's words; shown before the command's error, if there is one.
    pub text: String,
    /// The command that failed, if one did (boxed: a failure rides in every report's `Result`s
    /// and is rarely there).
    pub cause: Option<Box<CommandError>>,
}

impl Failure {
    /// `text`, then the failed command's error: "`text`: `cause`".
    pub fn after(text: impl Into<String>, cause: CommandError) -> Self {
        Failure {
            text: text.into(),
            cause: Some(Box::new(cause)),
        }
    }

    /// `text`, then this failure: "`text`: `self`", the failed command still kept as data.
    pub fn prefixed(self, text: impl Into<String>) -> Self {
        let text = text.into();
        Failure {
            text: if self.text.is_empty() {
                text
            } else {
                format!("{text}: {}", self.text)
            },
            cause: self.cause,
        }
    }

    /// The failed command's kind, if a command failed.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.cause.as_ref().map(|c| c.kind)
    }

    /// Gives the failed command `hints`' advice for its kind (advice already given is kept).
    pub fn advise(&mut self, hints: Hints) {
        if let Some(cause) = self.cause.as_mut() {
            cause.advise(hints);
        }
    }
}

impl From<CommandError> for Failure {
    fn from(cause: CommandError) -> Self {
        Failure {
            text: String::new(),
            cause: Some(Box::new(cause)),
        }
    }
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure { text, cause: None }
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Failure::from(text.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.cause, self.text.is_empty()) {
            (Some(cause), true) => write!(f, "{cause}"),
            (Some(cause), false) => write!(f, "{}: {cause}", self.text),
            (None, _) => f.write_str(&self.text),
        }
    }
}

/// As the text a person reads: JSON output is unchanged by keeping the error as data.
impl Serialize for Failure {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::transport::Command;

    fn timeout() -> CommandError {
        CommandError::without_completion(
            Path::new("/dev/sdb"),
            Command::Open,
            ErrorKind::Timeout,
            "no answer",
        )
    }

    #[test]
    fn reads_as_the_engines_words_then_the_command_and_advice_only_once_advised() {
        let mut failure = Failure::after("no path answered; the last error", timeout());
        let bare = failure.to_string();
        assert_eq!(
            bare,
            "no path answered; the last error: /dev/sdb: open failed: no answer"
        );
        failure.advise(|_| "raise it");
        failure.advise(|_| "ignored");
        assert_eq!(failure.to_string(), format!("{bare}. Hint: raise it"));
        assert_eq!(
            serde_json::to_string(&failure).unwrap(),
            format!("\"{bare}. Hint: raise it\"")
        );
        assert_eq!(Failure::from(timeout()).to_string(), timeout().to_string());
        let mut words = Failure::from("every path is dead");
        words.advise(|_| "never shown");
        assert_eq!(words.to_string(), "every path is dead");
        assert_eq!(words.kind(), None);
        assert_eq!(
            words.clone().prefixed("LU 1").to_string(),
            "LU 1: every path is dead"
        );
        let prefixed = Failure::from(timeout()).prefixed("READ KEYS failed");
        assert_eq!(
            prefixed.to_string(),
            format!("READ KEYS failed: {}", timeout())
        );
        assert_eq!(prefixed.kind(), Some(ErrorKind::Timeout));
    }
}
