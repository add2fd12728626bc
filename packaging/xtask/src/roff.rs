//! Just enough roff (man(7)) for pages written from text: escaping and inline markup.

/// Escapes text for roff: backslashes, hyphens that are options, and control characters at the
/// start of a line.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            _ => out.push(c),
        }
    }
    if out.starts_with('.') || out.starts_with('\'') {
        out.insert_str(0, "\\&");
    }
    out
}

/// Escapes text and turns Markdown's `code` and **strong** into bold.
pub fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut bold = false;
    let mut rest = text;
    while !rest.is_empty() {
        let (token, len) = if rest.starts_with("**") {
            (true, 2)
        } else if rest.starts_with('`') {
            (true, 1)
        } else {
            (false, rest.chars().next().map_or(1, char::len_utf8))
        };
        let (head, tail) = rest.split_at(len);
        if token {
            out.push_str(if bold { "\\fR" } else { "\\fB" });
            bold = !bold;
        } else {
            out.push_str(&escape(head));
        }
        rest = tail;
    }
    if bold {
        out.push_str("\\fR");
    }
    if out.starts_with('.') || out.starts_with('\'') {
        out.insert_str(0, "\\&");
    }
    out
}

/// The page header: `.TH NAME SECTION "" "prfence VERSION" "TITLE"`.
pub fn header(name: &str, section: &str, title: &str) -> String {
    format!(
        ".TH {} {section} \"\" \"prfence {}\" \"{title}\"\n",
        name.to_uppercase(),
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_marks_up() {
        assert_eq!(escape(".x -y \\z"), "\\&.x \\-y \\ez");
        assert_eq!(inline("a `b-c` **d**"), "a \\fBb\\-c\\fR \\fBd\\fR");
        assert_eq!(inline("`unclosed"), "\\fBunclosed\\fR");
    }
}
