//! A real Runnel server process on a loopback port, and a typed client for it.

mod client;

pub use client::{Client, json_of};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    /// Starts `runnel serve` with the given extra flags on a port the OS picks (unless the flags
    /// name one; long-poll timeout 500 ms unless they say otherwise), and waits until it reports
    /// its address.
    pub fn start(args: &[&str]) -> Server {
        Server::spawn(args, None)
    }

    /// Like `start`, with the server's info-level log written to `log`.
    pub fn start_logged(args: &[&str], log: &Path) -> Server {
        Server::spawn(args, Some(log))
    }

    fn spawn(args: &[&str], log: Option<&Path>) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runnel"));
        command.arg("serve").args(args);
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        if !args.contains(&"--long-poll-timeout-ms") {
            command.args(["--long-poll-timeout-ms", "500"]);
        }
        match log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("log file");
                command.env("RUST_LOG", "runnel=info").stderr(file);
            }
            None => {
                command.env("RUST_LOG", "error").stderr(Stdio::inherit());
            }
        }
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn runnel");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("server did not start in 20 s");
        let addr = line
            .trim()
            .strip_prefix("runnel listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from server: {line:?}"))
            .to_string();
        Server {
            child,
            base: format!("http://{addr}"),
        }
    }

    pub fn on_disk(dir: &Path) -> Server {
        Server::start(&["--data-dir", dir.to_str().expect("utf-8 path")])
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks the server to shut down (SIGTERM) and waits up to `within` for it to exit.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Ends the process with SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `runnel` with `args` and `env` (and no `RUST_LOG`) for a command that ends by itself,
/// within 60 s, and hands back what it printed.
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runnel"));
    command.args(args).env_remove("RUST_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("runnel did not exit within 60 s")
        .expect("runnel output")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

pub fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// A server speaking TLS for `localhost`, with a fresh self-signed certificate.
pub struct TlsServer {
    pub server: Server,
    /// The certificate as PEM, for clients and mirrors to trust.
    pub cert_path: std::path::PathBuf,
    cert: rcgen::CertifiedKey,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    /// Starts a server with `args` plus `--tls-cert` and `--tls-key`.
    pub fn start(args: &[&str]) -> TlsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .expect("self-signed certificate");
        let cert_path = dir.path().join("cert.pem");
        let key_path = dir.path().join("key.pem");
        std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).expect("write key");
        let mut all = args.to_vec();
        all.extend([
            "--tls-cert",
            cert_path.to_str().expect("utf-8 path"),
            "--tls-key",
            key_path.to_str().expect("utf-8 path"),
        ]);
        TlsServer {
            server: Server::start(&all),
            cert_path,
            cert,
            _dir: dir,
        }
    }

    /// A TLS client configuration that trusts this server, offering `alpn`.
    pub fn connector(&self, alpn: Vec<Vec<u8>>) -> tokio_rustls::TlsConnector {
        use tokio_rustls::rustls;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.cert.der().clone()).expect("trust root");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn;
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    }

    /// `https://localhost:PORT`, the name the certificate is for.
    pub fn https_base(&self) -> String {
        let port = self.server.base.rsplit(':').next().expect("a port");
        format!("https://localhost:{port}")
    }

    /// A client of `https_base` that trusts this server's certificate.
    pub fn client(&self) -> Client {
        let pem = std::fs::read(&self.cert_path).expect("the certificate");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM certificate"))
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        Client::over(http, &self.https_base())
    }
}
