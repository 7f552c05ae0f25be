//! Money as integer cents. Never a float.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An amount of US dollars in cents, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Amount(i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an amount of dollars (write it like 250, 250.00 or $250.00)")]
pub struct AmountError(String);

impl Amount {
    pub const ZERO: Amount = Amount(0);

    pub fn from_cents(cents: i64) -> Result<Self, AmountError> {
        if cents < 0 {
            return Err(AmountError(cents.to_string()));
        }
        Ok(Self(cents))
    }

    /// Whole dollars: never negative, and never past what cents can hold.
    pub fn from_dollars(dollars: u32) -> Self {
        Self(i64::from(dollars) * 100)
    }

    pub fn cents(self) -> i64 {
        self.0
    }
}

impl FromStr for Amount {
    type Err = AmountError;

    /// Parses `250`, `250.5`, `250.50` and `$250.50`; more than two decimals is refused.
    fn from_str(s: &str) -> Result<Self, AmountError> {
        let error = || AmountError(s.to_string());
        let digits = s.trim().strip_prefix('$').unwrap_or(s.trim());
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        let all_digits = |part: &str| part.chars().all(|c| c.is_ascii_digit());
        if whole.is_empty()
            || whole.len() > 12
            || fraction.len() > 2
            || !all_digits(whole)
            || !all_digits(fraction)
        {
            return Err(error());
        }
        let dollars: i64 = whole.parse().map_err(|_| error())?;
        let cents: i64 = match fraction.len() {
            0 => 0,
            1 => fraction.parse::<i64>().map_err(|_| error())? * 10,
            _ => fraction.parse().map_err(|_| error())?,
        };
        Ok(Self(dollars * 100 + cents))
    }
}

checked_conversions!(
    Amount,
    i64,
    AmountError,
    |cents| Self::from_cents(cents),
    |a| a.0
);

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}.{:02}", self.0 / 100, self.0 % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dollars_with_or_without_sign_and_cents() {
        assert_eq!("250".parse::<Amount>().unwrap().cents(), 25_000);
        assert_eq!("$250.5".parse::<Amount>().unwrap().cents(), 25_050);
        assert_eq!("42.07".parse::<Amount>().unwrap().cents(), 4_207);
        assert_eq!(" $0.99 ".parse::<Amount>().unwrap().cents(), 99);
    }

    #[test]
    fn refuses_what_is_not_an_amount() {
        for bad in [
            "",
            "$",
            "-5",
            "1.234",
            "12a",
            "1e3",
            "1,000",
            ".5",
            "9999999999999",
        ] {
            assert!(bad.parse::<Amount>().is_err(), "{bad:?} parsed");
        }
        assert!(Amount::from_cents(-1).is_err());
    }

    #[test]
    fn displays_as_dollars() {
        assert_eq!(Amount::from_cents(25_000).unwrap().to_string(), "$250.00");
        assert_eq!(Amount::from_cents(4_207).unwrap().to_string(), "$42.07");
        assert_eq!(Amount::from_dollars(500).to_string(), "$500.00");
    }
}
