//! TOML read from files an operator names (definitions, policies, scripts, the people file).
//! A refusal says where (line and column) and what is wrong, never the file's text: the TOML
//! library quotes the offending line, and a file may hold anything, a link's target included.

use serde::de::DeserializeOwned;

/// Why a TOML text does not parse into the type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", match at { Some((line, column)) => format!("line {line}, column {column}: "), None => String::new() })]
pub struct TomlError {
    /// Where the problem starts: line and column, from 1.
    pub at: Option<(usize, usize)>,
    /// The library's description of the problem, on one line, without the quoted source.
    pub message: String,
}

/// Parses `text` as `T`, as `toml::from_str` does, with a [`TomlError`] instead of the
/// library's error.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, TomlError> {
    toml::from_str(text).map_err(|error| TomlError {
        at: error.span().map(|span| line_and_column(text, span.start)),
        message: error
            .message()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// The line and column (from 1, in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let line = before.matches('\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Settings {
        name: String,
        count: u32,
    }

    #[test]
    fn a_syntax_error_names_line_and_column_but_never_the_text() {
        let text = "name = \"a\"\nroot:x:0:0:root:/root:/bin/bash\n";
        let error = from_str::<Settings>(text).unwrap_err();
        assert_eq!(error.at.map(|(line, _)| line), Some(2), "{error}");
        let told = error.to_string();
        assert!(told.starts_with("line 2, column "), "{told}");
        assert!(!told.contains("root:x"), "{told}");
        assert!(!told.contains('\n'), "{told}");
    }

    #[test]
    fn a_field_of_the_wrong_kind_names_its_place_and_the_problem() {
        let text = "name = \"a\"\ncount = \"many\"\nsecret_line = 1\n";
        let told = from_str::<Settings>(text).unwrap_err().to_string();
        assert!(told.starts_with("line 2, column 9: "), "{told}");
        assert!(told.contains("expected u32"), "{told}");
        let unknown = from_str::<Settings>("name = \"a\"\ncount = 1\nsecret_line = 1\n")
            .unwrap_err()
            .to_string();
        assert!(unknown.starts_with("line 3, column 1: "), "{unknown}");
        assert!(unknown.contains("unknown field"), "{unknown}");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        assert_eq!(line_and_column("é = 1\nab", 8), (2, 2));
        assert_eq!(line_and_column("né", 2), (1, 2));
        assert_eq!(line_and_column("", 5), (1, 1));
    }
}
