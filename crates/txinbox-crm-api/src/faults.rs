//! Injected faults: the counted ones, the random ones (a small seeded PRNG) and the `Retry-After`
//! value the `429`/`503` faults carry.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Probabilities of the random faults, one draw per create request (`POST /tasks`,
/// `POST /v1/tasks`, `PUT /v1/tasks/by_ref/..`) when no counted fault is armed.
///
/// Each rate is in `[0, 1]` and their sum is at most 1; the rest of the probability is "no fault".
/// `FaultRates::default()` (every rate 0) disables random faults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultRates {
    /// Performed, then the connection closed without an answer.
    pub drop_answer: f64,
    /// Answered `502` by the "gateway", the request not forwarded (nothing performed).
    pub gateway_502: f64,
    /// Performed, then answered `504` by the "gateway" (the answer lost).
    pub gateway_504: f64,
    /// Answered `503` with `Retry-After`, nothing performed.
    pub unavailable: f64,
    /// Answered `429` with `Retry-After`, nothing performed.
    pub rate_limited: f64,
}

impl FaultRates {
    fn rates(&self) -> [(f64, Fault); 5] {
        [
            (self.drop_answer, Fault::DropAnswer),
            (self.gateway_502, Fault::Gateway502),
            (self.gateway_504, Fault::Gateway504),
            (self.unavailable, Fault::Unavailable),
            (self.rate_limited, Fault::RateLimited),
        ]
    }

    /// Every rate in `[0, 1]`, their sum at most 1.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let rates = self.rates();
        if let Some((rate, fault)) = rates.iter().find(|(rate, _)| !(0.0..=1.0).contains(rate)) {
            return Err(format!(
                "the rate of {} must be in [0, 1], not {rate}",
                fault.name()
            ));
        }
        let sum: f64 = rates.iter().map(|(rate, _)| rate).sum();
        if sum > 1.0 + 1e-9 {
            return Err(format!("the fault rates add up to {sum}, more than 1"));
        }
        Ok(())
    }

    fn is_zero(&self) -> bool {
        self.rates().iter().all(|(rate, _)| *rate == 0.0)
    }
}

impl std::str::FromStr for FaultRates {
    type Err = String;

    /// `drop_answer=0.1,gateway_502=0.05,...` (the names of the fields; absent ones are 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut rates = FaultRates::default();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("expected NAME=RATE, got {pair:?}"))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{value:?} is not a number"))?;
            let slot = match name.trim() {
                "drop_answer" => &mut rates.drop_answer,
                "gateway_502" => &mut rates.gateway_502,
                "gateway_504" => &mut rates.gateway_504,
                "unavailable" => &mut rates.unavailable,
                "rate_limited" => &mut rates.rate_limited,
                other => return Err(format!("unknown fault {other:?}")),
            };
            *slot = value;
        }
        rates.validate()?;
        Ok(rates)
    }
}

/// The fault that applies to one create request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// `503` without `Retry-After`, nothing performed.
    FailBefore,
    /// `503` with `Retry-After`, nothing performed.
    Unavailable,
    /// `429` with `Retry-After`, nothing performed.
    RateLimited,
    /// `502` from the gateway, the request not forwarded.
    Gateway502,
    /// Performed, then `504` from the gateway.
    Gateway504,
    /// Performed, then the connection closed without an answer.
    DropAnswer,
}

impl Fault {
    /// Whether the request is answered by the fault without being performed.
    pub(crate) fn before(self) -> bool {
        matches!(
            self,
            Fault::FailBefore | Fault::Unavailable | Fault::RateLimited | Fault::Gateway502
        )
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::FailBefore => "fail_before",
            Fault::Unavailable => "unavailable",
            Fault::RateLimited => "rate_limited",
            Fault::Gateway502 => "gateway_502",
            Fault::Gateway504 => "gateway_504",
            Fault::DropAnswer => "drop_answer",
        }
    }
}

/// splitmix64: a tiny deterministic PRNG, plenty for drawing faults.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        // 53 random bits: exactly representable.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The armed faults, the random rates and the `Retry-After` setting.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    pub(crate) drop_answer: u64,
    pub(crate) fail_before: u64,
    pub(crate) gateway_502: u64,
    pub(crate) gateway_504: u64,
    pub(crate) unavailable: u64,
    pub(crate) rate_limited: u64,
    /// Searches and lookups answered `429` with `Retry-After`, nothing searched.
    pub(crate) searches_rate_limited: u64,
    pub(crate) retry_after_secs: u64,
    pub(crate) retry_after_date: bool,
    rates: FaultRates,
    seed: u64,
    rng: SplitMix64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            drop_answer: 0,
            fail_before: 0,
            gateway_502: 0,
            gateway_504: 0,
            unavailable: 0,
            rate_limited: 0,
            searches_rate_limited: 0,
            retry_after_secs: DEFAULT_RETRY_AFTER_SECS,
            retry_after_date: false,
            rates: FaultRates::default(),
            seed: 0,
            rng: SplitMix64(0),
        }
    }
}

/// The default `Retry-After`, in seconds.
const DEFAULT_RETRY_AFTER_SECS: u64 = 1;

impl Faults {
    /// Consumes the fault that applies to one create request: the counted ones first, in the order
    /// fail_before, unavailable, rate_limited, gateway_502, gateway_504, drop_answer; otherwise one
    /// random draw.
    pub(crate) fn next(&mut self) -> Fault {
        let counted = [
            (&mut self.fail_before, Fault::FailBefore),
            (&mut self.unavailable, Fault::Unavailable),
            (&mut self.rate_limited, Fault::RateLimited),
            (&mut self.gateway_502, Fault::Gateway502),
            (&mut self.gateway_504, Fault::Gateway504),
            (&mut self.drop_answer, Fault::DropAnswer),
        ];
        for (count, fault) in counted {
            if *count > 0 {
                *count -= 1;
                return fault;
            }
        }
        if self.rates.is_zero() {
            return Fault::None;
        }
        let draw = self.rng.next_f64();
        let mut bound = 0.0;
        for (rate, fault) in self.rates.rates() {
            bound += rate;
            if draw < bound {
                return fault;
            }
        }
        Fault::None
    }

    /// Sets the random rates (already validated) and restarts the PRNG from `seed`.
    pub(crate) fn set_random(&mut self, rates: FaultRates, seed: u64) {
        self.rates = rates;
        self.seed = seed;
        self.rng = SplitMix64(seed);
    }

    /// The `Retry-After` value: delta-seconds, or the IMF-fixdate of now + that many seconds,
    /// rounded up to the next whole second.
    pub(crate) fn retry_after(&self) -> String {
        if !self.retry_after_date {
            return self.retry_after_secs.to_string();
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let round_up = u64::from(now.subsec_nanos() > 0);
        http_date(
            now.as_secs()
                .saturating_add(self.retry_after_secs)
                .saturating_add(round_up),
        )
    }

    /// What `GET /_faults` and `POST /_faults` answer.
    pub(crate) fn view(&self) -> FaultsView {
        let random = !self.rates.is_zero();
        FaultsView {
            drop_answer: self.drop_answer,
            fail_before: self.fail_before,
            gateway_502: self.gateway_502,
            gateway_504: self.gateway_504,
            unavailable: self.unavailable,
            rate_limited: self.rate_limited,
            searches_rate_limited: self.searches_rate_limited,
            retry_after_secs: self.retry_after_secs,
            retry_after_date: self.retry_after_date,
            random: random.then_some(self.rates),
            seed: random.then_some(self.seed),
        }
    }
}

/// The faults as `/_faults` answers them: `drop_answer` and `fail_before` always, the other fields
/// only when they differ from their defaults (so the historical answer
/// `{"drop_answer": n, "fail_before": n}` is unchanged when nothing else is set).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultsView {
    drop_answer: u64,
    fail_before: u64,
    #[serde(skip_serializing_if = "is_zero")]
    gateway_502: u64,
    #[serde(skip_serializing_if = "is_zero")]
    gateway_504: u64,
    #[serde(skip_serializing_if = "is_zero")]
    unavailable: u64,
    #[serde(skip_serializing_if = "is_zero")]
    rate_limited: u64,
    #[serde(skip_serializing_if = "is_zero")]
    searches_rate_limited: u64,
    #[serde(skip_serializing_if = "is_default_retry_after")]
    retry_after_secs: u64,
    #[serde(skip_serializing_if = "is_false")]
    retry_after_date: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    random: Option<FaultRates>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_default_retry_after(n: &u64) -> bool {
    *n == DEFAULT_RETRY_AFTER_SECS
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The body of `POST /_faults`: every field optional, an absent one left as it is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArmFaults {
    drop_answer: Option<u64>,
    fail_before: Option<u64>,
    gateway_502: Option<u64>,
    gateway_504: Option<u64>,
    unavailable: Option<u64>,
    rate_limited: Option<u64>,
    retry_after_secs: Option<u64>,
    retry_after_date: Option<bool>,
    random: Option<FaultRates>,
    seed: Option<u64>,
}

impl ArmFaults {
    /// Applies the request; nothing is changed when it is refused.
    pub(crate) fn apply(self, faults: &mut Faults) -> Result<(), String> {
        if let Some(rates) = &self.random {
            rates.validate()?;
        }
        let counts = [
            (self.drop_answer, &mut faults.drop_answer),
            (self.fail_before, &mut faults.fail_before),
            (self.gateway_502, &mut faults.gateway_502),
            (self.gateway_504, &mut faults.gateway_504),
            (self.unavailable, &mut faults.unavailable),
            (self.rate_limited, &mut faults.rate_limited),
            (self.retry_after_secs, &mut faults.retry_after_secs),
        ];
        for (value, slot) in counts {
            if let Some(value) = value {
                *slot = value;
            }
        }
        if let Some(date) = self.retry_after_date {
            faults.retry_after_date = date;
        }
        match (self.random, self.seed) {
            (Some(rates), seed) => faults.set_random(rates, seed.unwrap_or(0)),
            (None, Some(seed)) => faults.set_random(faults.rates, seed),
            (None, None) => {}
        }
        Ok(())
    }
}

/// An IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`, of a Unix time.
pub(crate) fn http_date(unix_secs: u64) -> String {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]; // 1970-01-01: Thursday
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days, on days since 1970-01-01 (unsigned: no dates before it).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        day,
        MONTHS[(month - 1) as usize],
        year,
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_imf_fixdates() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(1_709_251_199), "Thu, 29 Feb 2024 23:59:59 GMT");
        assert_eq!(http_date(4_102_444_800), "Fri, 01 Jan 2100 00:00:00 GMT");
    }

    #[test]
    fn counted_faults_are_consumed_in_order_before_random_ones() {
        let mut faults = Faults::default();
        for slot in [
            &mut faults.drop_answer,
            &mut faults.gateway_504,
            &mut faults.gateway_502,
            &mut faults.rate_limited,
            &mut faults.unavailable,
            &mut faults.fail_before,
        ] {
            *slot = 1;
        }
        faults.set_random(
            FaultRates {
                drop_answer: 1.0,
                ..FaultRates::default()
            },
            3,
        );
        let order: Vec<_> = (0..7).map(|_| faults.next()).collect();
        assert_eq!(
            order,
            [
                Fault::FailBefore,
                Fault::Unavailable,
                Fault::RateLimited,
                Fault::Gateway502,
                Fault::Gateway504,
                Fault::DropAnswer,
                Fault::DropAnswer, // now drawn at random, at rate 1
            ]
        );
    }

    #[test]
    fn random_faults_follow_their_rates_and_the_seed() {
        let rates = FaultRates {
            drop_answer: 0.1,
            gateway_502: 0.2,
            rate_limited: 0.3,
            ..FaultRates::default()
        };
        let draw = |seed| {
            let mut faults = Faults::default();
            faults.set_random(rates, seed);
            (0..10_000).map(|_| faults.next()).collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        let share = |f| a.iter().filter(|&&x| x == f).count() as f64 / a.len() as f64;
        assert!((share(Fault::DropAnswer) - 0.1).abs() < 0.02);
        assert!((share(Fault::Gateway502) - 0.2).abs() < 0.02);
        assert!((share(Fault::RateLimited) - 0.3).abs() < 0.02);
        assert_eq!(share(Fault::Gateway504), 0.0);
        assert!((share(Fault::None) - 0.4).abs() < 0.02);
    }

    #[test]
    fn rates_are_validated_and_parsed() {
        assert!(FaultRates::default().validate().is_ok());
        for bad in [
            FaultRates {
                drop_answer: -0.1,
                ..FaultRates::default()
            },
            FaultRates {
                unavailable: f64::NAN,
                ..FaultRates::default()
            },
            FaultRates {
                drop_answer: 0.6,
                gateway_504: 0.6,
                ..FaultRates::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let parsed: FaultRates = "drop_answer=0.25, gateway_504=0.5".parse().unwrap();
        assert_eq!(parsed.drop_answer, 0.25);
        assert_eq!(parsed.gateway_504, 0.5);
        assert!("drop=1".parse::<FaultRates>().is_err());
        assert!("drop_answer=2".parse::<FaultRates>().is_err());
    }
}
