//! Orders and refunds: the service's rules, with no I/O. The hard limits live here, inside the
//! service, so no approval upstream can skip them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Money in integer minor units of the order's currency; never a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cents(pub i64);

impl fmt::Display for Cents {
    /// `75.00`: the decimal a person reads next to the cents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        write!(f, "{sign}{}.{:02}", abs / 100, abs % 100)
    }
}

/// The longest idempotency key the service stores.
pub const MAX_KEY_LEN: usize = 200;

/// An idempotency key as the caller sent it: 1 to 200 visible ASCII characters. Countersign
/// sends `action_id:version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, Refusal> {
        if raw.is_empty() {
            return Err(Refusal::MissingKey);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(Refusal::BadKey(format!(
                "the idempotency key has {} characters; at most {MAX_KEY_LEN} are allowed",
                raw.len()
            )));
        }
        if !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Refusal::BadKey(
                "the idempotency key must be visible ASCII characters, without spaces".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub sku: String,
    pub name: String,
    pub quantity: u32,
    pub price_cents: Cents,
}

/// An order as paid, with what has been refunded of it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub id: String,
    pub customer: String,
    pub currency: String,
    pub paid_cents: Cents,
    pub refunded_cents: Cents,
    pub items: Vec<Item>,
    pub note: String,
}

impl Order {
    pub fn refundable_cents(&self) -> Cents {
        Cents(self.paid_cents.0 - self.refunded_cents.0)
    }

    /// The hard limits: a positive amount, in the order's currency, and never more than was paid
    /// minus what was already refunded.
    pub fn check(&self, ask: &RefundAsk) -> Result<(), Refusal> {
        if ask.currency != self.currency {
            return Err(Refusal::CurrencyMismatch {
                asked: ask.currency.clone(),
                order: self.currency.clone(),
            });
        }
        if ask.amount_cents.0 <= 0 {
            return Err(Refusal::NotPositive(ask.amount_cents));
        }
        let refundable = self.refundable_cents();
        if ask.amount_cents > refundable {
            return Err(Refusal::ExceedsRefundable {
                asked: ask.amount_cents,
                refundable,
                currency: self.currency.clone(),
            });
        }
        Ok(())
    }
}

/// The body of a refund POST: the agent's exact approved arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundBody {
    pub order_id: Option<String>,
    pub amount_cents: i64,
    pub currency: String,
    pub reason: String,
}

/// A refund request once its path and body agree: what the idempotency key stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundAsk {
    pub order_id: String,
    pub amount_cents: Cents,
    pub currency: String,
    pub reason: String,
}

/// The longest reason the service stores.
const MAX_REASON_LEN: usize = 500;

impl RefundAsk {
    /// The order in the path is the one refunded; one in the body must name the same order.
    pub fn parse(path_order_id: &str, body: RefundBody) -> Result<Self, Refusal> {
        if let Some(body_order_id) = body.order_id
            && body_order_id != path_order_id
        {
            return Err(Refusal::OrderMismatch {
                path: path_order_id.to_owned(),
                body: body_order_id,
            });
        }
        let reason = body.reason.trim();
        if reason.is_empty() || reason.len() > MAX_REASON_LEN {
            return Err(Refusal::BadRequest(format!(
                "reason must be 1 to {MAX_REASON_LEN} characters"
            )));
        }
        Ok(Self {
            order_id: path_order_id.to_owned(),
            amount_cents: Cents(body.amount_cents),
            currency: body.currency,
            reason: reason.to_owned(),
        })
    }
}

/// A refund the service made: it took effect once, under its idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    pub refund_id: String,
    pub ask: RefundAsk,
    pub idempotency_key: String,
    pub created_at: String,
}

impl Refund {
    /// A replay must ask for exactly what the key first asked for.
    pub fn answers(&self, ask: &RefundAsk) -> bool {
        self.ask == *ask
    }
}

/// Why the service refuses a request; `code` is the stable name a caller acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    BadRequest(String),
    #[error("the Idempotency-Key header is required and must not be empty")]
    MissingKey,
    #[error("{0}")]
    BadKey(String),
    #[error("the body names order {body} but the path names order {path}")]
    OrderMismatch { path: String, body: String },
    #[error("order {0} does not exist")]
    UnknownOrder(String),
    #[error("amount_cents must be above zero, not {}", .0.0)]
    NotPositive(Cents),
    #[error("cannot refund {asked} {currency}: only {refundable} {currency} is left to refund")]
    ExceedsRefundable {
        asked: Cents,
        refundable: Cents,
        currency: String,
    },
    #[error("the order was paid in {order}, not {asked}")]
    CurrencyMismatch { asked: String, order: String },
    #[error("idempotency key {0} was already used for a different refund request")]
    KeyReused(String),
    #[error(
        "idempotency key {0} is void: a lookup found nothing for it, so it can never take effect"
    )]
    KeyVoid(String),
    #[error(
        "no refund was made with idempotency key {0}, and none will be: the key is now void, \
         so a request with it can never take effect"
    )]
    NoRefundForKey(String),
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::MissingKey => "missing_idempotency_key",
            Self::BadKey(_) => "bad_idempotency_key",
            Self::OrderMismatch { .. } => "order_mismatch",
            Self::UnknownOrder(_) | Self::NoRefundForKey(_) => "not_found",
            Self::NotPositive(_) => "invalid_amount",
            Self::ExceedsRefundable { .. } => "exceeds_refundable",
            Self::CurrencyMismatch { .. } => "currency_mismatch",
            Self::KeyReused(_) => "key_reused",
            Self::KeyVoid(_) => "key_void",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blender_order(refunded: i64) -> Order {
        Order {
            id: "ord_55".into(),
            customer: "cus_18".into(),
            currency: "USD".into(),
            paid_cents: Cents(14_900),
            refunded_cents: Cents(refunded),
            items: vec![],
            note: String::new(),
        }
    }

    fn ask(amount: i64, currency: &str) -> RefundAsk {
        RefundAsk {
            order_id: "ord_55".into(),
            amount_cents: Cents(amount),
            currency: currency.into(),
            reason: "damaged_item".into(),
        }
    }

    #[test]
    fn cents_read_as_decimals() {
        assert_eq!(Cents(7_500).to_string(), "75.00");
        assert_eq!(Cents(14_905).to_string(), "149.05");
        assert_eq!(Cents(7).to_string(), "0.07");
        assert_eq!(Cents(-250).to_string(), "-2.50");
    }

    #[test]
    fn a_refund_up_to_what_is_left_passes() {
        assert_eq!(blender_order(0).check(&ask(14_900, "USD")), Ok(()));
        assert_eq!(blender_order(7_500).check(&ask(7_400, "USD")), Ok(()));
    }

    #[test]
    fn never_more_than_was_paid() {
        let refused = blender_order(7_500).check(&ask(7_401, "USD")).unwrap_err();
        assert_eq!(refused.code(), "exceeds_refundable");
        assert_eq!(
            refused.to_string(),
            "cannot refund 74.01 USD: only 74.00 USD is left to refund"
        );
    }

    #[test]
    fn zero_negative_and_other_currencies_are_refused() {
        let order = blender_order(0);
        assert_eq!(
            order.check(&ask(0, "USD")).unwrap_err().code(),
            "invalid_amount"
        );
        assert_eq!(
            order.check(&ask(-100, "USD")).unwrap_err().code(),
            "invalid_amount"
        );
        assert_eq!(
            order.check(&ask(100, "EUR")).unwrap_err().code(),
            "currency_mismatch"
        );
    }

    #[test]
    fn the_body_must_name_the_paths_order_if_it_names_one() {
        let body = |order_id: Option<&str>| RefundBody {
            order_id: order_id.map(str::to_owned),
            amount_cents: 7_500,
            currency: "USD".into(),
            reason: "damaged_item".into(),
        };
        assert_eq!(
            RefundAsk::parse("ord_55", body(None)),
            Ok(ask(7_500, "USD"))
        );
        assert_eq!(
            RefundAsk::parse("ord_55", body(Some("ord_55"))),
            Ok(ask(7_500, "USD"))
        );
        let refused = RefundAsk::parse("ord_55", body(Some("ord_77"))).unwrap_err();
        assert_eq!(refused.code(), "order_mismatch");
    }

    #[test]
    fn keys_are_one_to_two_hundred_visible_characters() {
        assert!(IdempotencyKey::parse("act_4y4rjvv4ktak:2").is_ok());
        assert_eq!(IdempotencyKey::parse(""), Err(Refusal::MissingKey));
        assert!(IdempotencyKey::parse(&"k".repeat(MAX_KEY_LEN)).is_ok());
        let long = IdempotencyKey::parse(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err();
        assert_eq!(long.code(), "bad_idempotency_key");
        assert_eq!(
            IdempotencyKey::parse("a b").unwrap_err().code(),
            "bad_idempotency_key"
        );
    }
}
