//! A tiny HTTP/1.0 responder for `GET /metrics` (Prometheus text) and `GET /status` (the agent's
//! state as JSON, for tests and humans). One request per connection, no keep-alive, no body:
//! a metrics scrape needs nothing more, and every byte parsed is a byte that can go wrong.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::lock;
use super::metrics::Metrics;
use super::status::Status;

/// Connections served at once. Every open connection is a descriptor taken from the budget the
/// agent needs for SG_IO, the watchdog, the status and epoch files and the self-fence hook
/// (`LimitNOFILE=` in the unit counts it). One Prometheus and a curl or two is all a node sees;
/// 32 leaves room for several scrapers and still costs a bounded, small share of descriptors.
const MAX_CONNECTIONS: usize = 32;

/// The request head must arrive within this long and fit in [`MAX_HEAD`] bytes (a client that
/// sends nothing, or trickles bytes, is closed after this long: loopback scrapes take
/// microseconds).
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The response must be taken by the client within this long (one that never reads is closed).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// A request head larger than this is refused (431) and the connection closed.
const MAX_HEAD: usize = 8192;

/// What the endpoint shows.
#[derive(Clone)]
pub struct Exposed {
    pub metrics: Arc<Mutex<Metrics>>,
    pub status: Arc<Mutex<Status>>,
}

/// Serves until the task is aborted. Each connection is handled on its own task, at most
/// `MAX_CONNECTIONS` at once: when the cap is full, a new connection closes the oldest one.
/// Evicting the oldest (rather than refusing the newcomer, or leaving it in the kernel's backlog
/// until a slot frees) keeps the agent's descriptors bounded at `MAX_CONNECTIONS + 1` and still
/// lets a scrape through while someone holds idle connections: the oldest is the one most likely
/// idle, and every connection ends within `READ_TIMEOUT` + `WRITE_TIMEOUT` anyway.
pub async fn serve(listener: TcpListener, exposed: Exposed) {
    let mut open: VecDeque<AbortHandle> = VecDeque::with_capacity(MAX_CONNECTIONS);
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                open.retain(|task| !task.is_finished());
                while open.len() >= MAX_CONNECTIONS {
                    if let Some(oldest) = open.pop_front() {
                        // Dropping the task's future closes its socket.
                        oldest.abort();
                        lock(&exposed.metrics).record_http_evicted();
                    }
                }
                let exposed = exposed.clone();
                let task = tokio::spawn(async move {
                    if let Err(e) = respond(stream, &exposed).await {
                        tracing::debug!(error = %e, "metrics connection failed");
                    }
                });
                open.push_back(task.abort_handle());
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "metrics endpoint cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(mut stream: TcpStream, exposed: &Exposed) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match head {
        Some(head) => route(&head, exposed),
        None => (
            "431 Request Header Fields Too Large",
            text,
            format!("the request head must fit in {MAX_HEAD} bytes\n"),
        ),
    };
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(written) => written,
        Err(_) => Ok(()),
    }
}

/// Reads until the blank line ending the head (or the end of the stream); `None` if the head
/// does not end within [`MAX_HEAD`] bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    Ok(Some(String::from_utf8_lossy(&head).into_owned()))
}

fn route(head: &str, exposed: &Exposed) -> (&'static str, &'static str, String) {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (words.next(), words.next());
    let path = target.map(|t| t.split('?').next().unwrap_or(t));
    let text = "text/plain; charset=utf-8";
    match (method, path) {
        (Some("GET"), Some("/metrics")) => {
            let now = tokio::time::Instant::now().into_std();
            let body = lock(&exposed.metrics).render(now);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        (Some("GET"), Some("/status")) => {
            let body = lock(&exposed.status).to_json();
            ("200 OK", "application/json", body + "\n")
        }
        (Some("GET"), _) => (
            "404 Not Found",
            text,
            "try /metrics or /status\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            text,
            "only GET is served\n".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(address: std::net::SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_metrics_status_and_refuses_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let exposed = Exposed {
            metrics: Arc::new(Mutex::new(Metrics::new(["data".to_owned()]))),
            status: Arc::new(Mutex::new(Status::new(
                "watch",
                &crate::daemon::status::tests::one_lu(),
            ))),
        };
        let server = tokio::spawn(serve(listener, exposed));
        let r = get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        assert!(r.contains("version=0.0.4"), "{r}");
        assert!(
            r.contains("prfence_seconds_since_last_good_check{lu=\"data\"} +Inf"),
            "{r}"
        );
        let r = get(address, "GET /status HTTP/1.0\r\n\r\n").await;
        assert!(r.contains("\"mode\": \"watch\""), "{r}");
        let r = get(address, "GET / HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 404"), "{r}");
        let r = get(address, "POST /metrics HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 405"), "{r}");
        server.abort();
    }

    async fn start() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let exposed = Exposed {
            metrics: Arc::new(Mutex::new(Metrics::new(["data".to_owned()]))),
            status: Arc::new(Mutex::new(Status::new(
                "watch",
                &crate::daemon::status::tests::one_lu(),
            ))),
        };
        (address, tokio::spawn(serve(listener, exposed)))
    }

    /// What the server sends before closing, or `None` if it resets the connection.
    async fn read_until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.ok().map(|_| got)
    }

    #[tokio::test]
    async fn idle_connections_over_the_cap_do_not_block_a_scrape() {
        let (address, server) = start().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS * 3 {
            idle.push(TcpStream::connect(address).await.unwrap());
        }
        let started = std::time::Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(2),
            get(address, "GET /metrics HTTP/1.0\r\n\r\n"),
        )
        .await
        .expect("a scrape must be answered while idle connections are held");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        let evicted = r
            .lines()
            .find_map(|l| l.strip_prefix("prfence_http_connections_evicted_total "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap();
        assert!(evicted >= (MAX_CONNECTIONS * 2) as u64, "{r}");
        // The oldest idle connections were closed to make room.
        let first = idle.first_mut().unwrap();
        let closed = tokio::time::timeout(Duration::from_millis(500), read_until_closed(first))
            .await
            .unwrap();
        assert_eq!(closed.unwrap_or_default(), b"");
        server.abort();
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_read_deadline() {
        let (address, server) = start().await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let started = std::time::Instant::now();
        let closed = tokio::time::timeout(
            READ_TIMEOUT + Duration::from_secs(2),
            read_until_closed(&mut stream),
        )
        .await
        .expect("an idle connection must be closed");
        assert_eq!(closed.unwrap_or_default(), b"");
        assert!(started.elapsed() >= READ_TIMEOUT - Duration::from_millis(100));
        // A request trickled in more slowly than the deadline is closed too.
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\n")
            .await
            .unwrap();
        let closed = tokio::time::timeout(
            READ_TIMEOUT + Duration::from_secs(2),
            read_until_closed(&mut stream),
        )
        .await
        .expect("a trickling client must be closed");
        assert_eq!(closed.unwrap_or_default(), b"");
        server.abort();
    }

    #[tokio::test]
    async fn an_oversized_request_head_is_refused() {
        let (address, server) = start().await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let mut request = b"GET /metrics HTTP/1.0\r\n".to_vec();
        request.extend(std::iter::repeat_n(b"X-Pad: aaaaaaaaaaaaaaaa\r\n", 1000).flatten());
        // The server may close while this is still being written.
        let _ = stream.write_all(&request).await;
        let answer = tokio::time::timeout(Duration::from_secs(1), read_until_closed(&mut stream))
            .await
            .expect("an oversized head must be refused at once");
        let answer = String::from_utf8_lossy(&answer.unwrap_or_default()).into_owned();
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.0 431 "),
            "{answer}"
        );
        assert!(!answer.contains("prfence_"), "{answer}");
        server.abort();
    }
}
