//! The load generator's HTTP client: HTTP/1.1 written and read by the session's own task on
//! a TCP connection it holds for the request, kept open for the next request.
//!
//! Why not a general client, as it used before (reqwest): the client runs in the same
//! process as the server it measures, on the same two cores, so whatever it spends is taken
//! from the server. A profile of `--http` put a fifth of the pass's CPU in reqwest and in
//! the connection tasks of its pool: each answer crossed from that task to the session's
//! over a channel, one more wake-up per read. Here a request is one write and its answer is
//! read where it is used. What is left is what any client must do: write the request, parse
//! the head (`httparse`), undo the chunked framing, and parse the events.

use std::net::SocketAddr;

use anyhow::Context as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most header lines an answer may have.
const MAX_HEADERS: usize = 32;
/// The longest head an answer may have.
const MAX_HEAD: usize = 16 * 1024;

/// A client of one server (`http://IP:PORT`).
#[derive(Debug)]
pub(crate) struct HttpClient {
    address: SocketAddr,
    host: String,
    /// Connections whose last answer was read to its end: ready for another request.
    idle: Mutex<Vec<Connection>>,
}

#[derive(Debug)]
struct Connection {
    tcp: TcpStream,
    /// What was read and not used yet.
    buffer: Vec<u8>,
}

impl HttpClient {
    /// A client of `base`, which must be `http://IP:PORT` or `http://localhost:PORT` (load
    /// tests stay on loopback, and the caller checked that).
    pub(crate) fn new(base: &str) -> anyhow::Result<Self> {
        let authority = base
            .strip_prefix("http://")
            .with_context(|| format!("{base}: not http://IP:PORT"))?
            .trim_end_matches('/')
            .replace("localhost", "127.0.0.1");
        let address: SocketAddr = authority
            .parse()
            .with_context(|| format!("{base}: not http://IP:PORT"))?;
        Ok(Self {
            address,
            host: authority,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends a request (with `body`, JSON, unless it is a GET) and returns the answer once
    /// its head is read; its body is read through [`Answer`].
    pub(crate) async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> anyhow::Result<Answer<'_>> {
        let mut request = Vec::with_capacity(256 + body.len());
        request.extend_from_slice(
            format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.host).as_bytes(),
        );
        if let Some(token) = token {
            request.extend_from_slice(format!("authorization: Bearer {token}\r\n").as_bytes());
        }
        if method != "GET" {
            request.extend_from_slice(
                format!(
                    "content-type: application/json\r\ncontent-length: {}\r\n",
                    body.len()
                )
                .as_bytes(),
            );
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body);

        // Taken out first: the lock is not held across the connect below.
        let kept = self.idle.lock().pop();
        let (mut connection, reused) = match kept {
            Some(connection) => (connection, true),
            None => (self.connect().await?, false),
        };
        let written = connection.tcp.write_all(&request).await;
        let head = match written {
            Ok(()) => connection.read_head().await,
            Err(error) => Err(error.into()),
        };
        let head = match head {
            Ok(head) => head,
            // A kept connection the server closed meanwhile answers nothing; nothing was
            // taken, so the request goes once more, on a new one.
            Err(_) if reused => {
                connection = self.connect().await?;
                connection.tcp.write_all(&request).await?;
                connection.read_head().await?
            }
            Err(error) => return Err(error),
        };
        let framing = match head.length {
            _ if head.chunked => Framing::Chunked(Chunked::Size),
            Some(length) => Framing::Length(length),
            None => Framing::UntilClose,
        };
        Ok(Answer {
            client: self,
            status: head.status,
            keep: head.keep_alive && !matches!(framing, Framing::UntilClose),
            framing,
            connection: Some(connection),
        })
    }

    /// POSTs JSON and reads the JSON answer; an answer that is not 2xx is an error.
    pub(crate) async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &impl Serialize,
    ) -> anyhow::Result<Value> {
        self.send("POST", path, token, &serde_json::to_vec(body)?)
            .await?
            .json(path)
            .await
    }

    /// GETs a JSON answer; an answer that is not 2xx is an error.
    pub(crate) async fn get(&self, path: &str, token: &str) -> anyhow::Result<Value> {
        self.send("GET", path, Some(token), &[])
            .await?
            .json(path)
            .await
    }

    /// POSTs JSON and reads the answer as server-sent events.
    pub(crate) async fn stream(
        &self,
        path: &str,
        token: Option<&str>,
        body: &impl Serialize,
    ) -> anyhow::Result<Events<'_>> {
        let answer = self
            .send("POST", path, token, &serde_json::to_vec(body)?)
            .await?;
        if !(200..300).contains(&answer.status) {
            let status = answer.status;
            let text = answer.bytes().await?;
            anyhow::bail!(
                "{path} answered {status}: {}",
                String::from_utf8_lossy(&text)
            );
        }
        Ok(Events::new(answer))
    }

    async fn connect(&self) -> anyhow::Result<Connection> {
        let tcp = TcpStream::connect(self.address).await?;
        // A request goes out at once, not after Nagle's wait.
        tcp.set_nodelay(true)?;
        Ok(Connection {
            tcp,
            buffer: Vec::with_capacity(4096),
        })
    }
}

/// What the head of an answer says.
struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
}

impl Connection {
    /// Reads until `buffer` holds at least `wanted` bytes; an error at the end of the stream.
    async fn fill(&mut self, wanted: usize) -> anyhow::Result<()> {
        while self.buffer.len() < wanted {
            self.read_more().await?;
        }
        Ok(())
    }

    /// Moves the first `count` bytes of `buffer` to the end of `into`.
    fn take_into(&mut self, count: usize, into: &mut Vec<u8>) {
        into.extend_from_slice(&self.buffer[..count]);
        self.buffer.drain(..count);
    }

    async fn read_more(&mut self) -> anyhow::Result<()> {
        self.buffer.reserve(4096);
        let read = self.tcp.read_buf(&mut self.buffer).await?;
        anyhow::ensure!(read > 0, "the server closed the connection");
        Ok(())
    }

    /// Reads and parses the head of an answer, leaving its body in `buffer`.
    async fn read_head(&mut self) -> anyhow::Result<Head> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(used) = response.parse(&self.buffer)? {
                let mut head = Head {
                    status: response.code.context("no status")?,
                    length: None,
                    chunked: false,
                    keep_alive: true,
                };
                for header in response.headers.iter() {
                    let value = std::str::from_utf8(header.value)?.trim();
                    if header.name.eq_ignore_ascii_case("content-length") {
                        head.length = Some(value.parse()?);
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        head.chunked = value.eq_ignore_ascii_case("chunked");
                    } else if header.name.eq_ignore_ascii_case("connection") {
                        head.keep_alive = !value.eq_ignore_ascii_case("close");
                    }
                }
                self.buffer.drain(..used);
                return Ok(head);
            }
            anyhow::ensure!(self.buffer.len() < MAX_HEAD, "an answer's head is too long");
            self.read_more().await?;
        }
    }
}

/// How an answer's body ends.
#[derive(Debug)]
enum Framing {
    /// This many bytes are still to come.
    Length(usize),
    Chunked(Chunked),
    /// At the end of the connection.
    UntilClose,
}

/// Where a chunked body is.
#[derive(Debug)]
enum Chunked {
    /// A chunk's size line is next.
    Size,
    /// This many bytes of the chunk are still to come, then its CRLF.
    Data(usize),
    Done,
}

/// An answer whose body is still to be read. Read to its end, its connection goes back to
/// the client for the next request; dropped before, the connection is closed.
pub(crate) struct Answer<'a> {
    client: &'a HttpClient,
    pub(crate) status: u16,
    keep: bool,
    framing: Framing,
    connection: Option<Connection>,
}

impl Answer<'_> {
    /// Appends the next piece of the body to `into`; `false` at its end (the connection is
    /// then given back).
    async fn read_into(&mut self, into: &mut Vec<u8>) -> anyhow::Result<bool> {
        let Some(connection) = self.connection.as_mut() else {
            return Ok(false);
        };
        let more = match &mut self.framing {
            Framing::Length(0) | Framing::Chunked(Chunked::Done) => false,
            Framing::Length(left) => {
                if connection.buffer.is_empty() {
                    connection.read_more().await?;
                }
                let take = connection.buffer.len().min(*left);
                *left -= take;
                connection.take_into(take, into);
                true
            }
            Framing::UntilClose => {
                if connection.buffer.is_empty() && connection.read_more().await.is_err() {
                    false
                } else {
                    into.append(&mut connection.buffer);
                    true
                }
            }
            Framing::Chunked(state) => loop {
                match state {
                    Chunked::Size => {
                        let line = loop {
                            if let Some(at) = find(&connection.buffer, b"\r\n") {
                                break at;
                            }
                            anyhow::ensure!(
                                connection.buffer.len() < MAX_HEAD,
                                "a chunk size line is too long"
                            );
                            connection.read_more().await?;
                        };
                        let text = std::str::from_utf8(&connection.buffer[..line])?;
                        let size = text.split(';').next().unwrap_or_default().trim();
                        let size = usize::from_str_radix(size, 16)
                            .with_context(|| format!("bad chunk size {size:?}"))?;
                        connection.buffer.drain(..line + 2);
                        if size == 0 {
                            // No trailers from this server: the last CRLF ends the body.
                            connection.fill(2).await?;
                            connection.buffer.drain(..2);
                            *state = Chunked::Done;
                            break false;
                        }
                        *state = Chunked::Data(size);
                    }
                    Chunked::Data(0) => {
                        connection.fill(2).await?;
                        connection.buffer.drain(..2);
                        *state = Chunked::Size;
                    }
                    Chunked::Data(left) => {
                        if connection.buffer.is_empty() {
                            connection.read_more().await?;
                        }
                        let take = connection.buffer.len().min(*left);
                        *left -= take;
                        connection.take_into(take, into);
                        break true;
                    }
                    Chunked::Done => break false,
                }
            },
        };
        if !more {
            if let Some(connection) = self.connection.take() {
                if self.keep && connection.buffer.is_empty() {
                    self.client.idle.lock().push(connection);
                }
            }
        }
        Ok(more)
    }

    /// The whole body.
    async fn bytes(mut self) -> anyhow::Result<Vec<u8>> {
        let mut all = Vec::new();
        while self.read_into(&mut all).await? {}
        Ok(all)
    }

    /// The body as JSON; an error if the answer is not 2xx.
    async fn json(self, path: &str) -> anyhow::Result<Value> {
        let status = self.status;
        let body: Value = serde_json::from_slice(&self.bytes().await?)?;
        anyhow::ensure!(
            (200..300).contains(&status),
            "{path} answered {status}: {body}"
        );
        Ok(body)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// What the simulator reads of an event's `data`: the fields of the events it acts on (a
/// start's or an answer's first event, a chunk, the `end`). Others are skipped unread.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Event {
    pub(crate) session_id: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) code: Option<String>,
    pub(crate) at_ms: Option<u64>,
    pub(crate) kind: Option<Kind>,
}

/// A chunk's kind, as far as the simulator reads it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Kind {
    #[serde(rename = "type")]
    pub(crate) name: String,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) approval_id: Option<String>,
    #[serde(default)]
    pub(crate) tool_call_ids: Vec<String>,
    pub(crate) status: Option<String>,
}

/// The events of an SSE answer, one `data` at a time (the `end` event included).
pub(crate) struct Events<'a> {
    answer: Answer<'a>,
    buffer: Vec<u8>,
    /// How far `buffer` is known to hold no blank line.
    scanned: usize,
}

impl<'a> Events<'a> {
    pub(crate) fn new(answer: Answer<'a>) -> Self {
        Self {
            answer,
            buffer: Vec::new(),
            scanned: 0,
        }
    }

    /// The next event's data, or `None` once the answer ended (its connection is then free).
    pub(crate) async fn next(&mut self) -> anyhow::Result<Option<Event>> {
        loop {
            if let Some(at) = find(&self.buffer[self.scanned..], b"\n\n") {
                let end = self.scanned + at + 2;
                let event = data_of(&self.buffer[..end])?;
                self.buffer.drain(..end);
                self.scanned = 0;
                match event {
                    Some(event) => return Ok(Some(event)),
                    None => continue, // a keep-alive comment, or `retry` alone
                }
            }
            self.scanned = self.buffer.len().saturating_sub(1);
            if !self.answer.read_into(&mut self.buffer).await? {
                return Ok(None);
            }
        }
    }
}

/// The `data` line of one event block, parsed; `None` for a block without one.
fn data_of(block: &[u8]) -> anyhow::Result<Option<Event>> {
    for line in block.split(|byte| *byte == b'\n') {
        if let Some(data) = line.strip_prefix(b"data: ") {
            return Ok(Some(serde_json::from_slice(data)?));
        }
    }
    Ok(None)
}
