//! A request body read whole, within a size and a time: what a handler does instead of
//! axum's `Bytes` extractor, which has a size limit but no deadline, so a client trickling
//! its body would hold a connection and a task for ever.

use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use http_body::Body as _;

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit (bytes): answered 413.
    TooLarge(usize),
    /// Not received whole within the timeout: answered 408.
    Timeout(Duration),
    /// The connection failed while the body was read (the client went away, or sent a
    /// malformed chunk).
    Read(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge(max) => write!(f, "the request body is larger than {max} bytes"),
            BodyError::Timeout(d) => write!(
                f,
                "the request body was not received within {} s",
                d.as_secs_f64()
            ),
            BodyError::Read(e) => write!(f, "cannot read the request body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads `body` whole: at most `max` bytes (refused at once when the declared length is
/// over), within `timeout` of the call.
pub async fn read_body(body: Body, max: usize, timeout: Duration) -> Result<Bytes, BodyError> {
    if body.size_hint().lower() > max as u64 {
        return Err(BodyError::TooLarge(max));
    }
    let collect = async {
        let mut frames = body.into_data_stream();
        let mut whole: Vec<u8> = Vec::new();
        while let Some(chunk) = frames.next().await {
            let chunk = chunk.map_err(|e| BodyError::Read(e.to_string()))?;
            if whole.len() + chunk.len() > max {
                return Err(BodyError::TooLarge(max));
            }
            whole.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(whole))
    };
    tokio::time::timeout(timeout, collect)
        .await
        .unwrap_or(Err(BodyError::Timeout(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_size_and_time() {
        let ok = read_body(Body::from("abc"), 3, Duration::from_secs(1)).await;
        assert_eq!(ok.unwrap(), Bytes::from("abc"));
        let big = read_body(Body::from("abcd"), 3, Duration::from_secs(1)).await;
        assert_eq!(big, Err(BodyError::TooLarge(3)));
        // A body that never ends.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let stalled = Body::from_stream(tokio_stream_from(rx));
        let slow = read_body(stalled, 3, Duration::from_millis(50)).await;
        assert_eq!(slow, Err(BodyError::Timeout(Duration::from_millis(50))));
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures::Stream<Item = T> + Send + 'static {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
