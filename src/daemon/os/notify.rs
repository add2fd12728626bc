//! sd_notify(3), hand-written: one datagram per message to `$NOTIFY_SOCKET` (a path, or an
//! abstract name when it starts with '@'). Sending is best effort: systemd not listening must
//! never stop the agent.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;

/// Where READY=1, STATUS=…, WATCHDOG=1 go; a no-op when not run by systemd or not enabled.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// Sends nothing.
    pub fn disabled() -> Notifier {
        Notifier { target: None }
    }

    /// From `$NOTIFY_SOCKET`; disabled when it is unset or unusable (logged).
    pub fn from_env() -> Notifier {
        match std::env::var_os("NOTIFY_SOCKET") {
            Some(socket) => Notifier::to_socket(&socket.to_string_lossy()),
            None => {
                tracing::warn!(
                    "[systemd] notify = true, but NOTIFY_SOCKET is not set (not started by a \
                     Type=notify unit); not notifying"
                );
                Notifier::disabled()
            }
        }
    }

    /// To the socket named as in `$NOTIFY_SOCKET`.
    pub fn to_socket(name: &str) -> Notifier {
        let address = match name.strip_prefix('@') {
            Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
            None => SocketAddr::from_pathname(Path::new(name)),
        };
        let target = address.and_then(|address| Ok((UnixDatagram::unbound()?, address)));
        match target {
            Ok(target) => Notifier {
                target: Some(target),
            },
            Err(e) => {
                tracing::warn!(socket = name, error = %e, "cannot use NOTIFY_SOCKET; not notifying");
                Notifier::disabled()
            }
        }
    }

    /// Sends one message of `KEY=value` lines.
    pub fn send(&self, message: &str) {
        if let Some((socket, address)) = &self.target
            && let Err(e) = socket.send_to_addr(message.as_bytes(), address)
        {
            tracing::debug!(error = %e, message, "sd_notify failed");
        }
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    pub fn reloading(&self) {
        self.send("RELOADING=1");
    }
}

/// A STATUS value must stay on one line (a newline starts the next assignment).
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_abstract_sockets_receive_messages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::to_socket(path.to_str().unwrap());
        notifier.ready("watching 2 LUs\nhealthy");
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=watching 2 LUs healthy");

        let name = format!("prfence-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        Notifier::to_socket(&format!("@{name}")).watchdog();
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }

    #[test]
    fn nobody_listening_is_not_an_error() {
        Notifier::to_socket("/nonexistent/notify").watchdog();
        Notifier::disabled().watchdog();
    }
}
