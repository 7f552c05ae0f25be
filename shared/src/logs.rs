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
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{
    FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter, SubscriberBuilder,
};
use tracing_subscriber::layer::{Identity, SubscriberExt as _};
use tracing_subscriber::registry::{LookupSpan, Scope};
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
/// `INFO`; JSON when `AWS_LAMBDA_LOG_FORMAT` is `JSON` ([`lambda_json`]), else text with its
/// fields escaped.
pub fn for_lambda() {
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|level| LevelFilter::from_str(&level).ok())
        .unwrap_or(LevelFilter::INFO);
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy();
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    match json {
        true => lambda_json(std::io::stdout).with_env_filter(filter).init(),
        false => tracing_subscriber::fmt()
            .with_target(false)
            .without_time()
            .with_env_filter(filter)
            .with_writer(std::io::stdout)
            .with_ansi(colour_for(&std::io::stdout()))
            .fmt_fields(EscapedFields)
            .init(),
    }
}

/// Lambda's JSON log, written to `writer`: one [`FlatJson`] object a line, each span's fields
/// kept as JSON until an event inside it reads them.
pub fn lambda_json<W>(writer: W) -> SubscriberBuilder<JsonFields, FlatJson, LevelFilter, W>
where
    W: for<'writer> MakeWriter<'writer> + 'static,
{
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .fmt_fields(JsonFields::new())
        .event_format(FlatJson)
}

/// An event as one JSON object whose top-level keys are `level`, `message`, the event's other
/// fields and those of every span it happens in (the engine's `run_id`, `action_id`,
/// `approval_id` and `tenant`, the Lambda runtime's `requestId` and `xrayTraceId`), so Logs
/// Insights filters on them directly. A field of an inner span hides the same field of an outer
/// one, and the event's own hides both; `level` is always the event's. No timestamp, as in the
/// runtime's own JSON log: Lambda stamps each line. JSON escapes control characters.
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    N: for<'writer> FormatFields<'writer> + 'static,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = serde_json::Map::new();
        for span in context.event_scope().into_iter().flat_map(Scope::from_root) {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                continue;
            };
            if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(fields) {
                line.extend(fields);
            }
        }
        event.record(&mut JsonInto(&mut line));
        line.insert("level".into(), event.metadata().level().as_str().into());
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Records fields into a JSON object, by name, as `JsonFields` records a span's.
struct JsonInto<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl JsonInto<'_> {
    fn insert(&mut self, field: &Field, value: impl Into<serde_json::Value>) {
        let name = field.name();
        self.0
            .insert(name.trim_start_matches("r#").into(), value.into());
    }
}

impl Visit for JsonInto<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.insert(field, format!("{value:?}"));
    }
}

/// What `logging` logs, at any level, as the text log writes it: for tests of what is logged.
#[cfg(test)]
pub(crate) fn logged_by(logging: impl FnOnce()) -> String {
    let written = crate::testing::Written::default();
    let into = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || into.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .without_time()
        .fmt_fields(EscapedFields)
        .finish();
    tracing::subscriber::with_default(subscriber, logging);
    written.text()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::JsonLog;

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

    /// What `logging` logs, at any level, as Lambda's JSON log writes it: each line parsed.
    fn logged_as_json_by(logging: impl FnOnce()) -> Vec<serde_json::Value> {
        let log = JsonLog::capture();
        logging();
        log.lines()
    }

    #[test]
    fn given_nested_spans_then_a_json_line_has_their_fields_and_its_own_at_the_top_level() {
        let lines = logged_as_json_by(|| {
            let invoke = tracing::info_span!("Lambda runtime invoke", requestId = "req-1");
            let _invoke = invoke.enter();
            let decide = tracing::info_span!(
                "decide",
                tenant = "acme",
                approval_id = "ap-1",
                run_id = tracing::field::Empty
            );
            let _decide = decide.enter();
            decide.record("run_id", "run-1");
            let turn = tracing::info_span!("turn", action_id = "act-1", version = 2);
            let _turn = turn.enter();
            tracing::warn!(amount = 125, paid = true, "decided");
        });

        assert_eq!(
            lines,
            [serde_json::json!({
                "level": "WARN",
                "message": "decided",
                "amount": 125,
                "paid": true,
                "requestId": "req-1",
                "tenant": "acme",
                "approval_id": "ap-1",
                "run_id": "run-1",
                "action_id": "act-1",
                "version": 2,
            })]
        );
    }

    #[test]
    fn given_a_field_in_several_places_then_the_innermost_wins_and_the_events_own_over_all() {
        let lines = logged_as_json_by(|| {
            let outer = tracing::info_span!("outer", run_id = "outer", tenant = "acme");
            let _outer = outer.enter();
            let inner = tracing::info_span!("inner", run_id = "inner", action_id = "span");
            let _inner = inner.enter();
            tracing::info!("in the inner span");
            tracing::info!(action_id = "event", level = "forged", "its own");
        });

        assert_eq!(lines[0]["run_id"], "inner");
        assert_eq!(lines[0]["tenant"], "acme");
        assert_eq!(lines[1]["action_id"], "event");
        assert_eq!(
            lines[1]["level"], "INFO",
            "the level is the event's, never a field's"
        );
    }

    #[test]
    fn a_json_line_escapes_control_characters_and_stays_one_line() {
        let said = "boom\r\u{1b}[32mINFO approved by policy\n";
        let log = JsonLog::capture();
        let span = tracing::info_span!("turn", model = %said);
        span.in_scope(|| tracing::warn!(error = %said, "failed: {said}"));
        let text = log.text();

        assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
        assert!(!text.contains(['\r', '\u{1b}']), "{text:?}");
        assert!(text.contains(r"boom\r\u001b[32mINFO"), "{text:?}");
        let line: serde_json::Value = serde_json::from_str(&text).unwrap();
        for key in ["model", "error"] {
            assert_eq!(line[key], said, "{key} in {line}");
        }
        assert_eq!(line["message"], format!("failed: {said}"));
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
