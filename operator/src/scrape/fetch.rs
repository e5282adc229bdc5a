//! One HTTP GET with the body limit enforced while streaming.

use std::time::Duration;

use super::error::ScrapeError;

/// Fetches `url` and appends the body of a 2xx response of at most `max_body` bytes to
/// `body` (an empty, reused buffer). Never holds more than `max_body` bytes of it: a larger
/// `Content-Length` is refused before reading, and a body without one is dropped (closing
/// the connection) as soon as it passes the limit.
pub(crate) async fn fetch(
    client: &reqwest::Client,
    url: &str,
    body: &mut Vec<u8>,
    max_body: usize,
    timeout: Duration,
) -> Result<(), ScrapeError> {
    let mut resp = client
        .get(url)
        .header(reqwest::header::ACCEPT, "text/plain;version=0.0.4")
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                ScrapeError::Timeout(timeout)
            } else {
                ScrapeError::Connect(error_chain(&e))
            }
        })?;
    let status = resp.status();
    if !status.is_success() {
        return Err(ScrapeError::HttpStatus(status.as_u16()));
    }
    let too_large = ScrapeError::TooLarge { limit: max_body };
    let announced = resp.content_length();
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(too_large);
    }
    // Room from a trusted-after-check length only; the limit still applies below.
    body.reserve(announced.unwrap_or(0) as usize);
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max_body {
                    return Err(too_large);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(()),
            Err(e) if e.is_timeout() => return Err(ScrapeError::Timeout(timeout)),
            Err(e) => return Err(ScrapeError::Body(error_chain(&e))),
        }
    }
}

/// The error with its sources: reqwest's own message is often just "error sending request".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
