//! What an agent definition holds that must never be stored or shown (a header's value, a value
//! a `${VAR}` filled in, a stdio server's `env`, a model API's key), and every form one takes on
//! the wire, so that what a service, an MCP server or a model API says back is redacted of it
//! wherever it would be kept or shown: a result, an error, a cut answer, the audit, a log line.
//!
//! A secret is looked for as written, and in what a text reads once up to two layers of
//! percent-encoding (either hex case, some bytes or all) and JSON string escaping (`\"`,
//! `\u0041`) are undone, in either order: a token quoted in a URL, in a JSON string, in a URL in
//! a JSON string or in JSON in a query is found. A space may also stand as `+` (a form's
//! encoding). A secret of 5 bytes or more is looked for in base64 too, at each of the three
//! alignments, so within a longer text encoded whole (a Basic auth header's `user:password`).
//! A header `Basic <credentials>` makes its decoded `user:password`, and the password, secrets
//! as well.
//!
//! Values shorter than [`MIN_SECRET_BYTES`] are not secrets: they would match ordinary text
//! everywhere, and a value that short is guessed in moments anyway. One filled from the
//! environment where a credential stands (a header, a stdio server's `env`, a model's key) is
//! warned of at load, naming the field and the variable.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;

use crate::domain::action::ToolOutcome;

/// What stands in for a secret that no variable names.
pub const REDACTED: &str = "[redacted]";
/// The shortest value that is a secret.
pub const MIN_SECRET_BYTES: usize = 4;
/// How many layers of percent-encoding and JSON escaping are undone, looking for a secret.
const MAX_LAYERS: usize = 2;
/// The most bytes one byte of a secret takes on the wire in the forms looked for: `A` as the
/// JSON escape `\u0041`, then each of its six bytes percent-encoded.
const MAX_BYTES_PER_BYTE: usize = 18;
/// The shortest base64 form looked for: a shorter one would match by chance in any base64.
const MIN_BASE64_FORM: usize = 6;

/// The secrets of one binding, each with every form it is looked for in.
#[derive(Clone, Default)]
pub struct Secrets {
    secrets: Vec<Secret>,
}

#[derive(Clone)]
struct Secret {
    text: String,
    /// What stands in for it: its variable's `${NAME}`, or [`REDACTED`].
    shown: String,
    /// The byte strings that are it on the wire, before any layer of encoding: itself first.
    forms: Vec<Vec<u8>>,
}

impl Secret {
    fn new(text: &str, shown: String) -> Self {
        let mut forms = vec![text.as_bytes().to_vec()];
        if text.contains(' ') {
            forms.push(text.replace(' ', "+").into_bytes());
        }
        forms.extend(base64_forms(text.as_bytes()));
        Self {
            text: text.to_string(),
            shown,
            forms,
        }
    }
}

/// `Debug` says how many there are, never what they are.
impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({})", self.secrets.len())
    }
}

impl Secrets {
    /// `value`, shown as [`REDACTED`]; nothing if it is too short to be a secret.
    pub fn add(&mut self, value: &str) {
        self.insert(value, REDACTED.to_string());
    }

    /// The value of the variable `name`, shown as `${name}`.
    pub fn add_variable(&mut self, name: &str, value: &str) {
        self.insert(value, format!("${{{name}}}"));
    }

    /// A header's value: whole, the credentials after its scheme word (`Bearer <token>`), and
    /// for `Basic` the decoded `user:password` and the password.
    pub fn add_header(&mut self, value: &str) {
        self.add(value);
        let Some((scheme, credentials)) = value.split_once(' ') else {
            return;
        };
        let credentials = credentials.trim();
        self.add(credentials);
        if !scheme.eq_ignore_ascii_case("basic") {
            return;
        }
        let decoded = STANDARD
            .decode(credentials)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok());
        if let Some(user_password) = decoded {
            if let Some((_, password)) = user_password.split_once(':') {
                self.add(password);
            }
            self.add(&user_password);
        }
    }

    /// A value equal to one already held keeps the name of a variable it was filled from.
    fn insert(&mut self, value: &str, shown: String) {
        if value.len() < MIN_SECRET_BYTES {
            return;
        }
        let named = shown != REDACTED;
        match self.secrets.iter_mut().find(|s| s.text == value) {
            Some(held) if named && held.shown == REDACTED => held.shown = shown,
            Some(_) => {}
            None => self.secrets.push(Secret::new(value, shown)),
        }
    }

    /// Both sets together.
    pub fn merged(&self, other: &Secrets) -> Secrets {
        let mut all = self.clone();
        for secret in &other.secrets {
            all.insert(&secret.text, secret.shown.clone());
        }
        all
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// How many bytes past a cut must be read so that a secret crossing it, in any form looked
    /// for, is seen whole and redacted before the cut.
    pub fn reach(&self) -> usize {
        self.secrets
            .iter()
            .flat_map(|s| &s.forms)
            .map(|form| form.len() * MAX_BYTES_PER_BYTE)
            .max()
            .unwrap_or(0)
    }

    /// `text` with every secret, in any form, replaced by what stands in for it.
    pub fn redact(&self, text: &str) -> String {
        if self.secrets.is_empty() {
            return text.to_string();
        }
        let found = self.find(text);
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for hit in found {
            out.push_str(&text[at..hit.start]);
            out.push_str(&self.secrets[hit.secret].shown);
            at = hit.end;
        }
        out.push_str(&text[at..]);
        out
    }

    /// `value` with every string in it redacted, object keys included, and a number that
    /// shows a secret turned into the redacted text.
    pub fn redact_value(&self, value: Value) -> Value {
        if self.secrets.is_empty() {
            return value;
        }
        match value {
            Value::String(text) => Value::String(self.redact(&text)),
            Value::Number(number) => {
                let text = number.to_string();
                let redacted = self.redact(&text);
                match redacted == text {
                    true => Value::Number(number),
                    false => Value::String(redacted),
                }
            }
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact_value(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, v)| (self.redact(&key), self.redact_value(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// A tool's outcome with no secret in it: its result, its error or its detail redacted.
    pub fn redact_outcome(&self, outcome: ToolOutcome) -> ToolOutcome {
        match outcome {
            ToolOutcome::Succeeded { result } => ToolOutcome::Succeeded {
                result: self.redact_value(result),
            },
            ToolOutcome::Failed { error } => ToolOutcome::Failed {
                error: self.redact(&error),
            },
            ToolOutcome::Unknown { detail } => ToolOutcome::Unknown {
                detail: self.redact(&detail),
            },
            ToolOutcome::Mcp {
                content,
                structured_content,
                is_error,
            } => ToolOutcome::Mcp {
                content: content
                    .into_iter()
                    .map(|block| self.redact_value(block))
                    .collect(),
                structured_content: structured_content.map(|value| self.redact_value(value)),
                is_error,
            },
        }
    }

    /// `text` redacted, then cut to at most `limit` bytes of whole characters, without the first
    /// bytes of a secret it may then end in.
    pub fn redact_then_cut(&self, text: &str, limit: usize) -> String {
        let redacted = self.redact(text);
        let mut end = redacted.len().min(limit);
        while !redacted.is_char_boundary(end) {
            end -= 1;
        }
        self.without_partial_tail(&redacted[..end]).to_string()
    }

    /// A cut text without the first bytes of a secret it may end in, in any form, and without
    /// an escape the cut split (`%4`, `\u00`): nothing after them can show they were a secret's.
    pub fn without_partial_tail<'t>(&self, text: &'t str) -> &'t str {
        if self.secrets.is_empty() {
            return text;
        }
        let text = without_split_escape(text);
        let mut cut = text.len();
        for view in views(text) {
            for form in self.secrets.iter().flat_map(|s| &s.forms) {
                let longest = (form.len() - 1).min(view.len());
                let ends_in = (1..=longest)
                    .rev()
                    .find(|&n| view.bytes[view.len() - n..] == form[..n]);
                if let Some(n) = ends_in {
                    cut = cut.min(view.span(view.len() - n).0);
                }
            }
        }
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        &text[..cut]
    }

    /// Where secrets stand in `text`, as byte ranges of whole characters in order, overlapping
    /// ones merged under the longest secret among them.
    fn find(&self, text: &str) -> Vec<Hit> {
        let mut hits = Vec::new();
        for view in views(text) {
            for (secret, held) in self.secrets.iter().enumerate() {
                for form in &held.forms {
                    for at in positions(&view.bytes, form) {
                        let start = view.span(at).0;
                        let end = view.span(at + form.len() - 1).1;
                        hits.push(Hit { start, end, secret });
                    }
                }
            }
        }
        hits.sort_by_key(|hit| (hit.start, std::cmp::Reverse(hit.end)));
        let mut merged: Vec<Hit> = Vec::with_capacity(hits.len());
        for hit in hits {
            match merged.last_mut() {
                Some(last) if hit.start < last.end => {
                    last.end = last.end.max(hit.end);
                    if self.secrets[hit.secret].text.len() > self.secrets[last.secret].text.len() {
                        last.secret = hit.secret;
                    }
                }
                _ => merged.push(hit),
            }
        }
        for hit in &mut merged {
            while !text.is_char_boundary(hit.start) {
                hit.start -= 1;
            }
            while !text.is_char_boundary(hit.end) {
                hit.end += 1;
            }
        }
        merged
    }
}

/// One place a secret stands.
struct Hit {
    start: usize,
    end: usize,
    secret: usize,
}

/// The base64 of `secret` as it reads inside any longer text encoded whole: for each of the
/// three alignments, the characters only its own bytes decide, in both alphabets.
fn base64_forms(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = Vec::new();
    for offset in 0..3 {
        let mut aligned = vec![0; offset];
        aligned.extend_from_slice(secret);
        let first = (8 * offset).div_ceil(6);
        let last = 8 * aligned.len() / 6;
        if last < first + MIN_BASE64_FORM {
            continue;
        }
        for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let form = engine.encode(&aligned).as_bytes()[first..last].to_vec();
            if !forms.contains(&form) {
                forms.push(form);
            }
        }
    }
    forms
}

/// Where `needle` starts in `haystack`, overlaps included.
fn positions<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(move |(_, window)| *window == needle)
        .map(|(at, _)| at)
}

/// A text as bytes, each with the range of the original text it was decoded from.
struct View<'t> {
    bytes: Cow<'t, [u8]>,
    /// `None`: the text itself, each byte its own range.
    spans: Option<Vec<(usize, usize)>>,
}

impl View<'_> {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn span(&self, at: usize) -> (usize, usize) {
        match &self.spans {
            Some(spans) => spans[at],
            None => (at, at + 1),
        }
    }

    fn decoded(capacity: usize) -> Self {
        View {
            bytes: Cow::Owned(Vec::with_capacity(capacity)),
            spans: Some(Vec::with_capacity(capacity)),
        }
    }

    fn push(&mut self, byte: u8, span: (usize, usize)) {
        self.bytes.to_mut().push(byte);
        self.spans.as_mut().expect("a decoded view").push(span);
    }
}

/// `text`, and what it reads with up to [`MAX_LAYERS`] layers of encoding undone, in any order.
fn views(text: &str) -> Vec<View<'_>> {
    let mut views = vec![View {
        bytes: Cow::Borrowed(text.as_bytes()),
        spans: None,
    }];
    let mut layer = 0..1;
    for _ in 0..MAX_LAYERS {
        let mut next = Vec::new();
        for view in &views[layer.clone()] {
            next.extend(percent_decoded(view));
            next.extend(json_unescaped(view));
        }
        layer = views.len()..views.len() + next.len();
        views.extend(next);
    }
    views
}

fn hex(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// `%XX` (either case) as the byte it stands for; `None` when there is none.
fn percent_decoded(view: &View<'_>) -> Option<View<'static>> {
    if !view.bytes.contains(&b'%') {
        return None;
    }
    let bytes = &view.bytes;
    let mut out = View::decoded(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = match bytes.get(at..at + 3) {
            Some([b'%', high, low]) => hex(*high).zip(hex(*low)),
            _ => None,
        };
        match escaped {
            Some((high, low)) => {
                out.push(high << 4 | low, (view.span(at).0, view.span(at + 2).1));
                at += 3;
            }
            None => {
                out.push(bytes[at], view.span(at));
                at += 1;
            }
        }
    }
    Some(out)
}

/// The code unit of `\uXXXX` at `at`, if one is there.
fn json_code_unit(bytes: &[u8], at: usize) -> Option<u32> {
    match bytes.get(at..at + 6)? {
        [b'\\', b'u', digits @ ..] => digits
            .iter()
            .try_fold(0u32, |unit, &d| Some(unit << 4 | u32::from(hex(d)?))),
        _ => None,
    }
}

/// JSON's escapes as the bytes they stand for (`\u` ones as UTF-8, surrogate pairs joined);
/// `None` when there is none.
fn json_unescaped(view: &View<'_>) -> Option<View<'static>> {
    if !view.bytes.contains(&b'\\') {
        return None;
    }
    let bytes = &view.bytes;
    let mut out = View::decoded(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let short = match bytes.get(at..at + 2) {
            Some([b'\\', c @ (b'"' | b'\\' | b'/')]) => Some(*c),
            Some(b"\\b") => Some(0x08),
            Some(b"\\f") => Some(0x0c),
            Some(b"\\n") => Some(b'\n'),
            Some(b"\\r") => Some(b'\r'),
            Some(b"\\t") => Some(b'\t'),
            _ => None,
        };
        if let Some(byte) = short {
            out.push(byte, (view.span(at).0, view.span(at + 1).1));
            at += 2;
            continue;
        }
        let unit = json_code_unit(bytes, at);
        let (c, length) = match unit {
            Some(high @ 0xd800..=0xdbff) => match json_code_unit(bytes, at + 6) {
                Some(low @ 0xdc00..=0xdfff) => (
                    char::from_u32(0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)),
                    12,
                ),
                _ => (None, 6),
            },
            Some(unit) => (char::from_u32(unit), 6),
            None => (None, 1),
        };
        match c {
            Some(c) => {
                let span = (view.span(at).0, view.span(at + length - 1).1);
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    out.push(byte, span);
                }
                at += length;
            }
            None => {
                out.push(bytes[at], view.span(at));
                at += 1;
            }
        }
    }
    Some(out)
}

/// `text` without a percent or `\u` escape it ends in the middle of.
fn without_split_escape(text: &str) -> &str {
    let bytes = text.as_bytes();
    let from = bytes.len().saturating_sub(6);
    for at in (from..bytes.len()).rev() {
        let rest = &bytes[at + 1..];
        let split = match bytes[at] {
            b'%' => rest.len() < 2 && rest.iter().all(|&b| hex(b).is_some()),
            b'\\' => match rest {
                [] => true,
                [b'u', digits @ ..] => digits.len() < 4 && digits.iter().all(|&b| hex(b).is_some()),
                _ => false,
            },
            _ => false,
        };
        if split {
            return &text[..at];
        }
    }
    text
}

/// Warns, at load, that the variable `var` filled a credential into `field` too short to be
/// kept out of what is stored.
pub(crate) fn warn_too_short(field: &str, var: &str) {
    tracing::warn!(
        field,
        variable = var,
        "the value is shorter than {MIN_SECRET_BYTES} bytes: too short to redact, so it is not \
         kept out of results, errors and logs"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOKEN: &str = "tok-SECRET-abc/def+g h";

    fn token() -> Secrets {
        let mut secrets = Secrets::default();
        secrets.add(TOKEN);
        secrets
    }

    fn percent_encoded(text: &str, lower: bool) -> String {
        text.bytes()
            .map(|b| match (b.is_ascii_alphanumeric(), lower) {
                (true, _) => (b as char).to_string(),
                (false, false) => format!("%{b:02X}"),
                (false, true) => format!("%{b:02x}"),
            })
            .collect()
    }

    fn json_escaped(text: &str) -> String {
        let quoted = serde_json::to_string(text).unwrap();
        quoted[1..quoted.len() - 1].to_string()
    }

    #[test]
    fn a_secret_is_redacted_in_every_form_it_takes_on_the_wire() {
        let secrets = token();
        let every_byte_escaped: String = TOKEN
            .chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect();
        let with_quote = "tok\"SECRET\\abc";
        let mut quoted = Secrets::default();
        quoted.add(with_quote);
        for (secrets, form) in [
            (&secrets, TOKEN.to_string()),
            (&secrets, percent_encoded(TOKEN, false)),
            (&secrets, percent_encoded(TOKEN, true)),
            (&secrets, TOKEN.replace(' ', "+")),
            (&secrets, TOKEN.replace('/', "%2f").replace(' ', "%20")),
            (&secrets, every_byte_escaped.clone()),
            (&secrets, TOKEN.replace('/', "\\/")),
            (&secrets, percent_encoded(&every_byte_escaped, false)),
            (
                &secrets,
                percent_encoded(&percent_encoded(TOKEN, false), true),
            ),
            (&quoted, json_escaped(with_quote)),
            (&quoted, json_escaped(&json_escaped(with_quote))),
            (&quoted, percent_encoded(&json_escaped(with_quote), true)),
        ] {
            let text = format!("said: {form}!");
            assert_eq!(secrets.redact(&text), "said: [redacted]!", "{form}");
        }
    }

    #[test]
    fn a_secret_is_redacted_in_base64_whatever_text_it_was_encoded_with() {
        let mut secrets = Secrets::default();
        secrets.add("pw-hunter2");
        for prefix in ["", "u:", "us:", "use:"] {
            let encoded = STANDARD.encode(format!("{prefix}pw-hunter2"));
            let redacted = secrets.redact(&format!("Basic {encoded}"));
            assert!(redacted.contains(REDACTED), "{prefix}: {redacted}");
            // What is left encodes the text around it, and at most a byte of the secret each side.
            let kept = redacted.replace(REDACTED, "").len() - "Basic ".len();
            assert!(kept <= (8 * prefix.len()).div_ceil(6) + 4, "{redacted}");
        }
        // Too short for its base64 to be told from chance: only the text itself.
        let mut short = Secrets::default();
        short.add("abcd");
        assert_eq!(short.secrets[0].forms.len(), 1);
    }

    #[test]
    fn a_basic_header_makes_its_user_password_and_password_secrets() {
        let mut secrets = Secrets::default();
        secrets.add_header(&format!("Basic {}", STANDARD.encode("refunder:pw-789x")));
        assert_eq!(secrets.redact("user refunder:pw-789x"), "user [redacted]");
        assert_eq!(
            secrets.redact("bad password pw-789x"),
            "bad password [redacted]"
        );
        let mut bearer = Secrets::default();
        bearer.add_header("Bearer tok-123");
        assert_eq!(
            bearer.redact("Bearer tok-123 and tok-123"),
            "[redacted] and [redacted]"
        );
    }

    #[test]
    fn a_variable_shows_as_its_name_and_short_values_are_not_secrets() {
        let mut secrets = Secrets::default();
        secrets.add("s3cret-token");
        secrets.add_variable("ORDERS_TOKEN", "s3cret-token");
        secrets.add_variable("PORT", "80");
        secrets.add("");
        assert_eq!(
            secrets.redact("token s3cret-token on port 80"),
            "token ${ORDERS_TOKEN} on port 80"
        );
        assert_eq!(format!("{secrets:?}"), "Secrets(1)");
    }

    #[test]
    fn overlapping_secrets_are_redacted_whole_under_the_longest() {
        let mut secrets = Secrets::default();
        secrets.add("abcdef");
        secrets.add("efghij");
        secrets.add("Bearer abcdef");
        assert_eq!(secrets.redact("x abcdefghij y"), "x [redacted] y");
        assert_eq!(secrets.redact("Bearer abcdefghij"), "[redacted]");
        assert_eq!(secrets.redact("é abcdef é"), "é [redacted] é");
    }

    #[test]
    fn every_string_of_a_value_is_redacted_keys_and_numbers_included() {
        let mut secrets = token();
        secrets.add("12345678");
        let value = json!({
            TOKEN: [TOKEN, {"n": 12345678, "m": 42}],
            "url": format!("https://x.example/?k={}", percent_encoded(TOKEN, true)),
            "ok": true,
        });
        assert_eq!(
            secrets.redact_value(value),
            json!({
                "[redacted]": ["[redacted]", {"n": "[redacted]", "m": 42}],
                "url": "https://x.example/?k=[redacted]",
                "ok": true,
            })
        );
    }

    #[test]
    fn a_cut_keeps_none_of_a_secrets_first_bytes_in_any_form() {
        let secrets = token();
        let body = format!("{}{TOKEN} and more", "x".repeat(90));
        assert_eq!(
            secrets.redact_then_cut(&body, 100),
            format!("{}[redacted]", "x".repeat(90))
        );
        for broken in [
            "tok-SEC".to_string(),
            percent_encoded("tok-SEC", false),
            "tok%2".to_string(),
            "tok\\u002".to_string(),
            json_escaped("tok-SEC").replace('-', "\\u002d"),
        ] {
            let text = format!("{}{broken}", "x".repeat(10));
            assert_eq!(
                secrets.redact_then_cut(&text, 100),
                "x".repeat(10),
                "{broken}"
            );
        }
        assert_eq!(
            secrets.without_partial_tail("nothing secret here."),
            "nothing secret here."
        );
    }

    #[test]
    fn the_reach_covers_the_longest_form_of_the_longest_secret() {
        let secrets = token();
        let longest = secrets.secrets[0].forms.iter().map(Vec::len).max().unwrap();
        assert!(longest >= TOKEN.len());
        assert_eq!(secrets.reach(), longest * MAX_BYTES_PER_BYTE);
        assert_eq!(Secrets::default().reach(), 0);
    }

    #[test]
    fn an_outcome_is_redacted_whatever_it_is() {
        let secrets = token();
        let failed = ToolOutcome::Failed {
            error: format!("no: {TOKEN}"),
        };
        assert_eq!(
            secrets.redact_outcome(failed),
            ToolOutcome::Failed {
                error: "no: [redacted]".into()
            }
        );
        let unknown = ToolOutcome::Unknown {
            detail: json_escaped(TOKEN),
        };
        assert_eq!(
            secrets.redact_outcome(unknown),
            ToolOutcome::Unknown {
                detail: "[redacted]".into()
            }
        );
    }
}
