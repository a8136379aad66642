//! When to retry a failed attempt, and how long to wait first.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

/// Exponential backoff with full jitter: retry `n` (from 0) waits a uniformly random time in
/// `[0, min(max, base × 2ⁿ)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The wait before retry `retry` (from 0). A provider's `Retry-After` wins over the
    /// jittered backoff; one longer than `max` gives `None` (do not retry: a provider cannot
    /// park a run for an hour, and retrying sooner than it asked would be refused again).
    pub(crate) fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if let Some(wait) = retry_after {
            return (wait <= self.max).then_some(wait);
        }
        let ceiling = self
            .base
            .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
            .min(self.max);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        // fastrand rather than the clock's low bits: clients that failed together read
        // nearly the same time, and full jitter exists to spread exactly those apart.
        Some(Duration::from_nanos(fastrand::u64(..=nanos)))
    }
}

/// Whether a status is worth another attempt: rate limits and the overloaded or unavailable
/// answers of a server or its gateway (529 is Anthropic-style "overloaded").
pub(crate) fn is_retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504 | 529)
}

/// The `Retry-After` header as a wait from `now`: delta-seconds or an HTTP-date (a date in
/// the past waits nothing).
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        // Not in the RFC, but some gateways send fractional seconds.
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only HTTP-date form a
/// server may send today (RFC 9110 §5.6.7).
fn http_date(text: &str) -> Option<SystemTime> {
    let (_weekday, rest) = text.split_once(", ")?;
    let mut parts = rest.split(' ');
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: u64 = parts.next()?.parse().ok()?;
    let mut clock = parts.next()?.split(':').map(str::parse::<u64>);
    let (hour, minute, second) = (
        clock.next()?.ok()?,
        clock.next()?.ok()?,
        clock.next()?.ok()?,
    );
    if parts.next()? != "GMT" || parts.next().is_some() || clock.next().is_some() {
        return None;
    }
    if !(1..=31).contains(&day) || year < 1970 || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days from 1970-01-01 to a date on or after it (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770); // Sun, 06 Nov 1994 08:49:30 GMT
        assert_eq!(retry_after(&headers("0"), now), Some(Duration::ZERO));
        assert_eq!(
            retry_after(&headers(" 7 "), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers("1.5"), now),
            Some(Duration::from_millis(1500))
        );
        let date = headers("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(retry_after(&date, now), Some(Duration::from_secs(7)));
        let past = UNIX_EPOCH + Duration::from_secs(900_000_000);
        assert_eq!(retry_after(&date, past), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn http_dates_match_the_calendar() {
        let at = |text| http_date(text).and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(
            at("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(Duration::from_secs(951_825_600))
        );
        assert_eq!(
            at("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(1_445_412_480))
        );
        assert_eq!(at("Wed, 21 Oct 2015 07:28:00 UTC"), None);
        assert_eq!(at("Wed, 21 Foo 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn backoff_grows_jitters_and_caps() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for retry in 0..40 {
            let ceiling = Duration::from_millis(100)
                .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
                .min(Duration::from_secs(1));
            assert!(backoff
                .delay(retry, None)
                .is_some_and(|wait| wait <= ceiling));
        }
        assert_eq!(backoff.delay(0, Some(Duration::from_secs(3600))), None);
        let asked = backoff.delay(0, Some(Duration::from_millis(700)));
        assert_eq!(asked, Some(Duration::from_millis(700)));
        let instant = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(instant.delay(5, None), Some(Duration::ZERO));
    }

    #[test]
    fn only_transient_statuses_are_retried() {
        for code in [429, 500, 502, 503, 504, 529] {
            assert!(is_retryable(
                StatusCode::from_u16(code).expect("valid status")
            ));
        }
        for code in [400, 401, 403, 404, 413, 422, 501] {
            assert!(!is_retryable(
                StatusCode::from_u16(code).expect("valid status")
            ));
        }
    }
}
