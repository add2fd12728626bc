//! A tiny HTTP/1.0 responder for `GET /metrics` (Prometheus text) and `GET /status` (the agent's
//! state as JSON, for tests and humans). One request per connection, no keep-alive, no body:
//! a metrics scrape needs nothing more, and every byte parsed is a byte that can go wrong.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::metrics::Metrics;
use super::status::Status;
use super::storage::lock;

/// The request head must arrive within this long and fit in [`MAX_HEAD`] bytes.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD: usize = 8192;

/// What the endpoint shows.
#[derive(Clone)]
pub struct Exposed {
    pub metrics: Arc<Mutex<Metrics>>,
    pub status: Arc<Mutex<Status>>,
}

/// Serves until the task is aborted. Each connection is handled on its own task.
pub async fn serve(listener: TcpListener, exposed: Exposed) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                let exposed = exposed.clone();
                tokio::spawn(async move {
                    if let Err(e) = respond(stream, &exposed).await {
                        tracing::debug!(error = %e, "metrics connection failed");
                    }
                });
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
    let (status, content_type, body) = route(&head, exposed);
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads until the blank line ending the head, or [`MAX_HEAD`] bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
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
            let body = serde_json::to_string_pretty(&*lock(&exposed.status))
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
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
            status: Arc::new(Mutex::new(Status::new("watch", &["data".to_owned()]))),
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
}
