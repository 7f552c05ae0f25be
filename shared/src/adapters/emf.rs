//! The metrics of a function on AWS, as CloudWatch's Embedded Metric Format: one JSON line on
//! stdout per thing counted, which CloudWatch Logs turns into metrics with no API call and no
//! write to the table. Names are those `GET /metrics` serves on the embedded store, in the
//! namespace `Countersign`, with the dimensions tenant and agent (and outcome, mode).

use std::io::Write;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::engine::{AgentFigures, Figures};
use crate::ports::counters::{Count, Series};

/// The CloudWatch namespace every metric goes to.
pub const NAMESPACE: &str = "Countersign";

/// Where the lines go: stdout in a function, which Lambda sends to CloudWatch Logs.
#[derive(Clone)]
pub struct Emf {
    out: Arc<Mutex<dyn Write + Send>>,
}

impl std::fmt::Debug for Emf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Emf")
    }
}

impl Emf {
    pub fn stdout() -> Self {
        Self::to(std::io::stdout())
    }

    /// Lines written to `out` (a test reads them back).
    pub fn to(out: impl Write + Send + 'static) -> Self {
        Self {
            out: Arc::new(Mutex::new(out)),
        }
    }

    /// The line of each count a committed transaction kept.
    pub fn counted(&self, counts: &[Count], at: DateTime<Utc>) {
        self.write(counts.iter().filter_map(|count| count_line(count, at)));
    }

    /// The gauges of every tenant and agent in `figures`, a line each.
    pub fn figures(&self, figures: &Figures) {
        self.write(figures.agents.iter().map(|a| gauge_line(a, figures.at)));
    }

    /// Each line whole, under one lock, so a log line written at once cannot split one.
    fn write(&self, lines: impl Iterator<Item = Value>) {
        let mut text = String::new();
        for line in lines {
            text.push_str(&line.to_string());
            text.push('\n');
        }
        if text.is_empty() {
            return;
        }
        let Ok(mut out) = self.out.lock() else { return };
        // A metric lost to a closed stdout must not fail what it counted, which committed.
        if let Err(error) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            tracing::warn!(%error, "could not write metrics");
        }
    }
}

/// One metric of a line: its name, unit and value.
struct Metric {
    name: &'static str,
    unit: &'static str,
    value: f64,
}

/// What one directive of a line extracts: its metrics, each along every one of its dimension
/// sets (CloudWatch bills each metric and dimension set as a custom metric of its own).
struct Directive<'a> {
    dimension_sets: &'a [&'a [&'a str]],
    metrics: &'a [Metric],
}

/// A line: each directive's metrics at `at`, with the dimensions' values as top-level strings
/// beside the metrics' values.
fn line(at: DateTime<Utc>, dimensions: &[(&str, &str)], directives: &[Directive]) -> Value {
    let mut root = Map::new();
    let extracted: Vec<Value> = directives
        .iter()
        .map(|directive| {
            json!({
                "Namespace": NAMESPACE,
                "Dimensions": directive.dimension_sets,
                "Metrics": directive
                    .metrics
                    .iter()
                    .map(|m| json!({"Name": m.name, "Unit": m.unit}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": at.timestamp_millis(),
            "CloudWatchMetrics": extracted,
        }),
    );
    for (name, value) in dimensions {
        root.insert((*name).into(), Value::String((*value).into()));
    }
    for metric in directives.iter().flat_map(|d| d.metrics) {
        root.insert(metric.name.into(), json!(metric.value));
    }
    Value::Object(root)
}

/// The metric `name` of `count`: how many it adds (one thing, or a turn's tokens).
fn counted(name: &'static str, count: &Count) -> Metric {
    Metric {
        name,
        unit: "Count",
        value: count.n as f64,
    }
}

/// The line of one count; none for a histogram bucket's, which CloudWatch has no use for: it
/// keeps the decision's seconds themselves and computes percentiles from them.
pub fn count_line(count: &Count, at: DateTime<Utc>) -> Option<Value> {
    let (tenant, agent) = (count.tenant.as_str(), count.agent.as_str());
    Some(match count.series {
        // The count by outcome and the time by tenant and agent alone: what the dashboard
        // and a percentile read, and no more billed metrics than that.
        Series::Decisions(outcome) => line(
            at,
            &[
                ("tenant", tenant),
                ("agent", agent),
                ("outcome", outcome.as_str()),
            ],
            &[
                Directive {
                    dimension_sets: &[&["tenant", "agent", "outcome"]],
                    metrics: &[counted("countersign_decisions_total", count)],
                },
                Directive {
                    dimension_sets: &[&["tenant", "agent"]],
                    metrics: &[Metric {
                        name: "countersign_decision_seconds",
                        unit: "Seconds",
                        value: count.seconds,
                    }],
                },
            ],
        ),
        Series::DecidedWithin(_) => return None,
        Series::Executions(outcome) => one_metric(
            count,
            at,
            &[("outcome", outcome.as_str())],
            "countersign_executions_total",
        ),
        Series::Rulings(outcome, mode) => one_metric(
            count,
            at,
            &[("outcome", outcome.name()), ("mode", mode.as_str())],
            "countersign_policy_outcomes_total",
        ),
        Series::ModelRequests(outcome) => one_metric(
            count,
            at,
            &[("outcome", outcome.as_str())],
            "countersign_model_requests_total",
        ),
        Series::ModelTokens(kind) => one_metric(
            count,
            at,
            &[("kind", kind.as_str())],
            "countersign_model_tokens_total",
        ),
        Series::ResumeFailures => one_metric(count, at, &[], "countersign_resume_failures_total"),
    })
}

/// The line of a count that is one metric, extracted by tenant, agent and `labels` together.
fn one_metric(
    count: &Count,
    at: DateTime<Utc>,
    labels: &[(&'static str, &str)],
    name: &'static str,
) -> Value {
    let mut dimensions = vec![
        ("tenant", count.tenant.as_str()),
        ("agent", count.agent.as_str()),
    ];
    dimensions.extend_from_slice(labels);
    let keys: Vec<&str> = dimensions.iter().map(|(key, _)| *key).collect();
    line(
        at,
        &dimensions,
        &[Directive {
            dimension_sets: &[&keys],
            metrics: &[counted(name, count)],
        }],
    )
}

/// The gauges of one agent of one tenant.
pub fn gauge_line(figures: &AgentFigures, at: DateTime<Utc>) -> Value {
    line(
        at,
        &[
            ("tenant", figures.tenant.as_str()),
            ("agent", figures.agent.as_str()),
        ],
        &[Directive {
            dimension_sets: &[&["tenant", "agent"]],
            metrics: &[
                Metric {
                    name: "countersign_approvals_waiting",
                    unit: "Count",
                    value: figures.approvals_waiting as f64,
                },
                Metric {
                    name: "countersign_approval_oldest_wait_seconds",
                    unit: "Seconds",
                    value: figures.oldest_wait_seconds,
                },
                Metric {
                    name: "countersign_unknown_outcomes",
                    unit: "Count",
                    value: figures.unknown_outcomes as f64,
                },
            ],
        }],
    )
}

/// Lines written to memory, for a test to read back as a function's stdout would show them.
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Default)]
pub struct Printed(Arc<Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "testing"))]
impl Write for Printed {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
impl Printed {
    /// Each line printed so far, parsed; a line that is not one JSON object panics.
    pub fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect()
    }
}

/// The first rule of the Embedded Metric Format specification (CloudWatch's "Specification:
/// Embedded metric format") that `line` breaks, if any:
/// - the root holds `_aws`, an object whose `Timestamp` is a number of milliseconds since the
///   epoch and whose `CloudWatchMetrics` is an array of metric directives;
/// - a directive holds `Namespace` (a string), `Dimensions` (an array of dimension sets, each an
///   array of dimension keys, at most 30) and `Metrics` (at most 100 metric definitions);
/// - a dimension key must name a member of the root whose value is a string;
/// - a metric definition holds `Name`, which names a member of the root whose value is a number
///   (or an array of numbers), and may hold `Unit`, one of CloudWatch's units.
#[cfg(any(test, feature = "testing"))]
pub fn rule_broken(line: &Value) -> Option<String> {
    const UNITS: [&str; 4] = ["Count", "Seconds", "Milliseconds", "None"];
    let broken = |rule: &str| Some(format!("{rule}: {line}"));
    let Some(aws) = line.get("_aws").and_then(Value::as_object) else {
        return broken("the root holds no _aws object");
    };
    // Milliseconds: a count of seconds since 1970 would be before 1971 in milliseconds.
    match aws.get("Timestamp").and_then(Value::as_i64) {
        Some(ms) if ms > 10_000_000_000 => {}
        _ => return broken("_aws.Timestamp is not a time in milliseconds"),
    }
    let Some(directives) = aws.get("CloudWatchMetrics").and_then(Value::as_array) else {
        return broken("_aws.CloudWatchMetrics is not an array");
    };
    for directive in directives {
        if !directive.get("Namespace").is_some_and(Value::is_string) {
            return broken("a directive has no Namespace string");
        }
        let Some(sets) = directive.get("Dimensions").and_then(Value::as_array) else {
            return broken("a directive's Dimensions is not an array");
        };
        for set in sets {
            let Some(keys) = set.as_array() else {
                return broken("a dimension set is not an array");
            };
            if keys.len() > 30 {
                return broken("a dimension set holds more than 30 keys");
            }
            let strings = keys.iter().all(|key| {
                key.as_str()
                    .and_then(|key| line.get(key))
                    .is_some_and(Value::is_string)
            });
            if !strings {
                return broken("a dimension key names no top-level string");
            }
        }
        let Some(metrics) = directive.get("Metrics").and_then(Value::as_array) else {
            return broken("a directive's Metrics is not an array");
        };
        if metrics.len() > 100 {
            return broken("a directive holds more than 100 metrics");
        }
        for metric in metrics {
            let value = metric
                .get("Name")
                .and_then(Value::as_str)
                .and_then(|name| line.get(name));
            let numeric = match value {
                Some(Value::Array(values)) => values.iter().all(Value::is_number),
                Some(value) => value.is_number(),
                None => false,
            };
            if !numeric {
                return broken("a metric's Name names no top-level number");
            }
            let unit = metric.get("Unit");
            if unit.is_some_and(|unit| !unit.as_str().is_some_and(|u| UNITS.contains(&u))) {
                return broken("a metric's Unit is not one this code uses of CloudWatch's");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AgentName, TenantId};
    use crate::domain::policy::VerdictKind;
    use crate::ports::counters::{
        DECISION_BUCKETS, DecisionOutcome, ExecutionOutcome, ModelOutcome, RuleMode, Series,
        TokenKind,
    };

    fn count(series: Series, seconds: f64) -> Count {
        Count {
            seconds,
            ..Count::one(
                &TenantId::parse("acme").unwrap(),
                &AgentName::parse("expense").unwrap(),
                series,
            )
        }
    }

    fn at() -> DateTime<Utc> {
        "2026-12-07T11:00:00Z".parse().unwrap()
    }

    #[test]
    fn every_count_but_a_bucket_is_one_valid_line_with_its_names_and_dimensions() {
        let buckets = |series: &Series| matches!(series, Series::DecidedWithin(_));
        for series in Series::all().into_iter().filter(|s| !buckets(s)) {
            let line = count_line(&count(series, 600.0), at()).unwrap();
            assert_eq!(rule_broken(&line), None);
            assert_eq!(line["_aws"]["Timestamp"], at().timestamp_millis());
            assert_eq!(
                line["_aws"]["CloudWatchMetrics"][0]["Namespace"],
                "Countersign"
            );
            // A metric named by two directives would be billed along both's dimension sets.
            let names: Vec<&Value> = line["_aws"]["CloudWatchMetrics"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|d| d["Metrics"].as_array().unwrap())
                .map(|m| &m["Name"])
                .collect();
            let distinct: std::collections::BTreeSet<String> =
                names.iter().map(|n| n.to_string()).collect();
            assert_eq!(names.len(), distinct.len(), "{line}");
            assert_eq!(
                (line["tenant"].as_str(), line["agent"].as_str()),
                (Some("acme"), Some("expense"))
            );
        }
        for bucket in 0..=DECISION_BUCKETS.len() {
            assert_eq!(
                count_line(&count(Series::DecidedWithin(bucket), 0.0), at()),
                None
            );
        }

        let decided = count_line(
            &count(Series::Decisions(DecisionOutcome::Edited), 600.0),
            at(),
        );
        let decided = decided.unwrap();
        assert_eq!(decided["outcome"], "edited");
        assert_eq!(decided["countersign_decisions_total"], 1.0);
        assert_eq!(decided["countersign_decision_seconds"], 600.0);
        // Each metric under its own dimension sets only: five billed metrics per tenant and
        // agent (a count per outcome and one time), not ten.
        assert_eq!(
            decided["_aws"]["CloudWatchMetrics"],
            json!([
                {
                    "Namespace": "Countersign",
                    "Dimensions": [["tenant", "agent", "outcome"]],
                    "Metrics": [{"Name": "countersign_decisions_total", "Unit": "Count"}],
                },
                {
                    "Namespace": "Countersign",
                    "Dimensions": [["tenant", "agent"]],
                    "Metrics": [{"Name": "countersign_decision_seconds", "Unit": "Seconds"}],
                },
            ])
        );
        let ruled = Series::Rulings(VerdictKind::Approve, RuleMode::LogOnly);
        let ruled = count_line(&count(ruled, 0.0), at()).unwrap();
        assert_eq!(
            (ruled["outcome"].as_str(), ruled["mode"].as_str()),
            (Some("approve"), Some("log_only"))
        );
        assert_eq!(ruled["countersign_policy_outcomes_total"], 1.0);
        let ran = Series::Executions(ExecutionOutcome::Unknown);
        let ran = count_line(&count(ran, 0.0), at()).unwrap();
        assert_eq!(ran["outcome"], "unknown");
        assert_eq!(ran["countersign_executions_total"], 1.0);

        let failed = Series::ModelRequests(ModelOutcome::Error);
        let failed = count_line(&count(failed, 0.0), at()).unwrap();
        assert_eq!(failed["outcome"], "error");
        assert_eq!(failed["countersign_model_requests_total"], 1.0);
        assert_eq!(
            failed["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["tenant", "agent", "outcome"]])
        );
        // A turn's tokens are one line of their number, not a line per token.
        let read = Count {
            n: 1200,
            ..count(Series::ModelTokens(TokenKind::Input), 0.0)
        };
        let read = count_line(&read, at()).unwrap();
        assert_eq!(read["kind"], "input");
        assert_eq!(read["countersign_model_tokens_total"], 1200.0);
        assert_eq!(
            read["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["tenant", "agent", "kind"]])
        );
        let resume = count_line(&count(Series::ResumeFailures, 0.0), at()).unwrap();
        assert_eq!(resume["countersign_resume_failures_total"], 1.0);
        assert_eq!(
            resume["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["tenant", "agent"]])
        );
        assert_eq!(resume.get("outcome"), None);
    }

    #[test]
    fn the_gauges_of_an_agent_are_one_valid_line() {
        let figures = AgentFigures {
            approvals_waiting: 2,
            oldest_wait_seconds: 90.5,
            unknown_outcomes: 1,
            ..AgentFigures::new(
                TenantId::parse("acme").unwrap(),
                AgentName::parse("expense").unwrap(),
            )
        };
        let line = gauge_line(&figures, at());
        assert_eq!(rule_broken(&line), None);
        assert_eq!(line["countersign_approvals_waiting"], 2.0);
        assert_eq!(line["countersign_approval_oldest_wait_seconds"], 90.5);
        assert_eq!(line["countersign_unknown_outcomes"], 1.0);
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["tenant", "agent"]])
        );
    }

    #[test]
    fn a_line_that_breaks_a_rule_of_the_format_is_caught() {
        let good = gauge_line(
            &AgentFigures::new(
                TenantId::parse("acme").unwrap(),
                AgentName::parse("expense").unwrap(),
            ),
            at(),
        );
        let broken = |change: &dyn Fn(&mut Value)| {
            let mut line = good.clone();
            change(&mut line);
            rule_broken(&line).expect("a broken rule")
        };
        assert!(
            broken(&|l| l["_aws"]["Timestamp"] = json!(at().timestamp())).contains("milliseconds")
        );
        assert!(broken(&|l| l["tenant"] = json!(1)).contains("top-level string"));
        assert!(
            broken(&|l| l["countersign_unknown_outcomes"] = json!("1"))
                .contains("top-level number")
        );
        let many: Vec<String> = (0..31).map(|i| format!("d{i}")).collect();
        assert!(
            broken(&|l| {
                for key in &many {
                    l[key] = json!("x");
                }
                l["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = json!([many]);
            })
            .contains("30")
        );
        let metrics: Vec<Value> = (0..101)
            .map(|_| json!({"Name": "countersign_unknown_outcomes"}))
            .collect();
        assert!(
            broken(&|l| l["_aws"]["CloudWatchMetrics"][0]["Metrics"] = json!(metrics))
                .contains("100")
        );
    }

    #[test]
    fn counts_committed_together_are_printed_a_whole_line_each() {
        let printed = Printed::default();
        let emf = Emf::to(printed.clone());
        emf.counted(
            &[
                count(Series::Decisions(DecisionOutcome::Approved), 12.0),
                count(Series::DecidedWithin(1), 0.0),
                count(Series::Executions(ExecutionOutcome::Succeeded), 0.0),
            ],
            at(),
        );
        let lines = printed.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["countersign_decision_seconds"], 12.0);
        assert_eq!(lines[1]["countersign_executions_total"], 1.0);
    }
}
