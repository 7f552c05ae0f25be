//! Log lines a reader can trust. Every field and message is written as a terminal may print it
//! ([`Escaping`]), so what a model, a tool or an upstream's stderr said cannot forge a line of
//! its own, move the cursor or colour the text; colour is used only where the log goes to a
//! terminal and `NO_COLOR` is unset. JSON logs (Lambda's, when its log format is JSON) escape
//! control characters by JSON's own rules.

use std::ffi::OsStr;
use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::str::FromStr;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::layer::{Identity, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

/// Writes through to `out`, escaping what a terminal would act on: control characters (C0,
/// DEL, C1) as `\r`, `\t`, `\u{1b}`, and the characters that reorder text around them
/// (bidirectional overrides and isolates) or break it; line breaks too unless `lines`.
pub struct Escaping<W> {
    pub out: W,
    /// Line breaks pass through.
    pub lines: bool,
}

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for c in text.chars() {
            match c {
                '\n' if self.lines => self.out.write_char(c)?,
                '\n' => self.out.write_str("\\n")?,
                '\r' => self.out.write_str("\\r")?,
                '\t' => self.out.write_str("\\t")?,
                c if acts_on_terminal(c) => write!(self.out, "\\u{{{:x}}}", u32::from(c))?,
                c => self.out.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Control characters, and the invisible ones that reorder the text around them or break it.
fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}'
        )
}

/// `text` as a terminal may print it, its line breaks kept where `lines`, else escaped too.
pub fn escaped(text: &str, lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let _ = Escaping {
        out: &mut out,
        lines,
    }
    .write_str(text);
    out
}

/// The fields of an event or a span as `message name=value …`, each message and value
/// escaped on one line.
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = FieldWriter {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct FieldWriter<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl FieldWriter<'_> {
    fn write(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = match field.name() {
            "message" => write!(self.writer, "{separator}"),
            name => write!(self.writer, "{separator}{}=", name.trim_start_matches("r#")),
        }
        .and_then(|()| {
            Escaping {
                out: &mut self.writer,
                lines: false,
            }
            .write_fmt(value)
        });
    }
}

impl Visit for FieldWriter<'_> {
    /// A message as it was written; another text field quoted, as `Debug` shows it.
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.write(field, format_args!("{value}")),
            _ => self.write(field, format_args!("{value:?}")),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, format_args!("{value:?}"));
    }
}

/// Whether to colour a log written to a stream that `is_terminal` says is one or not, given
/// the value of `NO_COLOR` (<https://no-color.org>: set and not empty, no colour).
fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// [`colour`] for `stream`, in this process's environment.
fn colour_for(stream: &impl IsTerminal) -> bool {
    colour(
        stream.is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Logs to stderr (stdout is the command's output), filtered by `RUST_LOG` or else by
/// `default_filter`, such as `warn`.
pub fn to_stderr(default_filter: &str) {
    to_stderr_beside(default_filter, None::<Identity>);
}

/// [`to_stderr`], and every span and event at info or above to `traces` too where there is
/// one, whatever the log's own filter: the log stays as quiet as asked while traces see the
/// engine's spans.
pub fn to_stderr_beside<L: Layer<Registry> + Send + Sync>(default_filter: &str, traces: Option<L>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    match traces {
        // The log's filter is the whole process's: what it leaves out is never even built.
        None => tracing_subscriber::registry()
            .with(stderr_log())
            .with(filter)
            .init(),
        Some(traces) => tracing_subscriber::registry()
            .with(traces.with_filter(LevelFilter::INFO))
            .with(stderr_log().with_filter(filter))
            .init(),
    }
}

/// The text log on stderr, its fields escaped, coloured only on a terminal.
fn stderr_log<S>() -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_for(&std::io::stderr()))
        .fmt_fields(EscapedFields)
}

/// A Lambda function's log, on stdout as Lambda reads it, configured as the runtime's default
/// one is: the level from `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG` (with its directives), else
/// `INFO`; JSON when `AWS_LAMBDA_LOG_FORMAT` is `JSON`, else text with its fields escaped.
pub fn for_lambda() {
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|level| LevelFilter::from_str(&level).ok())
        .unwrap_or(LevelFilter::INFO);
    let builder = tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_env_filter(
            EnvFilter::builder()
                .with_default_directive(level.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stdout);
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    match json {
        true => builder.json().with_ansi(false).init(),
        false => builder
            .with_ansi(colour_for(&std::io::stdout()))
            .fmt_fields(EscapedFields)
            .init(),
    }
}

/// What `logging` logs, at any level, as the text log writes it: for tests of what is logged.
#[cfg(test)]
pub(crate) fn logged_by(logging: impl FnOnce()) -> String {
    let written = tests::Written::default();
    let into = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || into.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .without_time()
        .fmt_fields(EscapedFields)
        .finish();
    tracing::subscriber::with_default(subscriber, logging);
    let bytes = written.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    pub(super) struct Written(pub(super) Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_field_and_message_is_escaped_onto_its_line() {
        let said = "boom\r\u{1b}[32mINFO approved by policy\n\u{202e}";
        let text = logged_by(|| {
            let span = tracing::info_span!("turn", model = %said);
            let _in = span.enter();
            tracing::warn!(error = %said, quoted = said, debug = ?said, "failed: {said}");
        });
        assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
        assert!(!text.contains(['\r', '\u{1b}', '\u{202e}']), "{text:?}");
        let escaped = r"boom\r\u{1b}[32mINFO approved by policy\n\u{202e}";
        for part in [
            format!("turn{{model={escaped}}}"),
            format!("failed: {escaped}"),
            format!("error={escaped}"),
        ] {
            assert!(text.contains(&part), "{part} in {text:?}");
        }
        assert!(text.contains(r#"quoted="boom\r"#), "{text:?}");
    }

    #[test]
    fn colour_only_on_a_terminal_that_no_color_leaves_alone() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR says nothing"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(
            !colour(false, None),
            "a pipe or a file gets no colour codes"
        );
    }

    #[test]
    fn text_is_escaped_its_line_breaks_kept_or_not() {
        assert_eq!(escaped("a\r\nb\u{7}", false), r"a\r\nb\u{7}");
        assert_eq!(escaped("a\r\nb", true), "a\\r\nb");
        assert_eq!(escaped("plain, ünïcode", false), "plain, ünïcode");
    }
}
