//! Running a helper program (corosync-cmapctl, vgs, a self-fence hook) with a time bound: the
//! one place that spawns, drains and kills.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a bounded run did not produce output.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start it: {0}")]
    Spawn(std::io::Error),
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
    #[error("timed out after {0:?} and was killed")]
    TimedOut(Duration),
    #[error("{status} ({stderr})")]
    Failed { status: ExitStatus, stderr: String },
}

/// Runs `program args…` with stdin closed and returns its stdout. With a timeout, a run still
/// going after it is killed and reported as [`RunError::TimedOut`]; a non-zero exit is
/// [`RunError::Failed`] with the trimmed stderr.
pub fn run_bounded<I, S>(
    program: &Path,
    args: I,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, RunError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(RunError::Spawn)?;
    // Drain both pipes on threads so a large output cannot block the child while we wait.
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                // A read error only shortens the output, which the caller then fails to parse.
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(RunError::Wait)? {
            Some(status) => break status,
            None if timeout.is_some_and(|t| started.elapsed() >= t) => {
                // Best effort: the child may have exited between try_wait and kill.
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::TimedOut(started.elapsed()));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        return Err(RunError::Failed {
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        });
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_failure_and_timeout() {
        let sh = Path::new("/bin/sh");
        assert_eq!(run_bounded(sh, ["-c", "echo hi"], None).unwrap(), b"hi\n");
        let e = run_bounded(sh, ["-c", "echo bad >&2; exit 3"], None).unwrap_err();
        assert!(
            matches!(&e, RunError::Failed { stderr, .. } if stderr == "bad"),
            "{e}"
        );
        let e = run_bounded(sh, ["-c", "sleep 5"], Some(Duration::from_millis(100))).unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)));
        assert!(matches!(
            run_bounded(Path::new("/nonexistent"), [""; 0], None),
            Err(RunError::Spawn(_))
        ));
    }
}
