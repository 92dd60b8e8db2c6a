//! DNS servers to probe: a real `dnsmasq` serving fixed records, and an
//! in-test responder that answers the way a broken or hostile server would.

use crate::closed_port;
use crate::tools::tool;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// A `dnsmasq` serving fixed records on a loopback port, killed on drop.
pub struct Dnsmasq {
    child: Child,
    /// Where it listens (UDP and TCP).
    pub addr: SocketAddr,
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The records a recursive dnsmasq serves: `a.example.test` A, an MX and a
/// TXT on `example.test`, NXDOMAIN for other names under `example.test`.
pub const RECORDS: &[&str] = &[
    "--local=/example.test/",
    "--address=/a.example.test/192.0.2.1",
    "--host-record=h.example.test,192.0.2.7",
    "--mx-host=example.test,mail.example.test,10",
    "--txt-record=t.example.test,hello world",
    "--txt-record=spf.example.test,v=spf1 -all,second string",
];

/// An authoritative dnsmasq's zone, `zone.test` with serial 2026112701 (on
/// an address it serves authoritatively, dnsmasq refuses other queries).
pub const ZONE: &[&str] = &[
    "--auth-server=ns.zone.test,127.0.0.1",
    "--auth-zone=zone.test",
    "--auth-soa=2026112701,hostmaster.zone.test",
    "--host-record=www.zone.test,192.0.2.9",
];

/// Starts a dnsmasq serving `records` (its options), or `None` (the test
/// skips, unless `SONDE_REQUIRE_TOOLS` is set) when it is not installed.
pub fn dnsmasq_with(records: &[&str]) -> Option<Dnsmasq> {
    let bin = tool("dnsmasq", "dnsmasq-base")?;
    let port = closed_port().port();
    let child = Command::new(bin)
        .args([
            "--no-daemon",
            &format!("--port={port}"),
            "--listen-address=127.0.0.1",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--conf-file=/dev/null",
            "--pid-file=",
        ])
        .args(records)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dnsmasq");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = Dnsmasq { child, addr };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "dnsmasq did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(server)
}

/// How the in-test server answers a query (its bytes): the datagrams to
/// send back, none to stay silent.
pub type Answer = Arc<dyn Fn(&[u8]) -> Vec<Vec<u8>> + Send + Sync>;

/// A UDP server on loopback that counts the datagrams it receives and
/// answers each as `answer` says, from its own socket or, with
/// `from_elsewhere`, from another one; with `tcp`, a TCP server on the same
/// port answers as `tcp` says (one length-framed reply per query).
pub struct Responder {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Responder {
    /// Starts answering: see [`Responder`].
    pub async fn start(answer: Answer, from_elsewhere: bool, tcp: Option<Answer>) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let count = received.clone();
        let mut tasks = vec![tokio::spawn(async move {
            let mut buf = vec![0; 65536];
            while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
                count.fetch_add(1, Ordering::SeqCst);
                for reply in answer(&buf[..n]) {
                    let from = if from_elsewhere { &other } else { &socket };
                    let _ = from.send_to(&reply, peer).await;
                }
            }
        })];
        if let Some(tcp) = tcp {
            let listener = TcpListener::bind(addr).await.unwrap();
            tasks.push(tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let mut len = [0; 2];
                    if stream.read_exact(&mut len).await.is_err() {
                        continue;
                    }
                    let mut query = vec![0; usize::from(u16::from_be_bytes(len))];
                    if stream.read_exact(&mut query).await.is_err() {
                        continue;
                    }
                    for reply in tcp(&query) {
                        let _ = stream.write_all(&(reply.len() as u16).to_be_bytes()).await;
                        let _ = stream.write_all(&reply).await;
                    }
                }
            }));
        }
        Self { addr, received, tasks }
    }

    /// A responder on UDP only that sends one datagram, `answer`'s, per query.
    pub async fn answering(answer: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static) -> Self {
        Self::start(Arc::new(move |q| vec![answer(q)]), false, None).await
    }

    /// How many datagrams it received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Flags of a response: QR, RD and RA set, with `rcode`.
pub const RESPONSE: u16 = 0x8180;

/// The TC bit.
pub const TRUNCATED: u16 = 0x0200;

/// A reply to `query` (a header and one question, as the plugin sends):
/// its ID and question, `flags`, the counts given and then `records`.
pub fn reply(query: &[u8], flags: u16, counts: [u16; 3], records: &[u8]) -> Vec<u8> {
    let mut r = query[..2].to_vec();
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    for c in counts {
        r.extend_from_slice(&c.to_be_bytes());
    }
    r.extend_from_slice(&query[12..]);
    r.extend_from_slice(records);
    r
}

/// An A record for the question's name (a pointer to offset 12).
pub fn a_record(ip: [u8; 4]) -> Vec<u8> {
    let mut r = vec![0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4];
    r.extend_from_slice(&ip);
    r
}
