//! The scenarios: append, fanout, replay, batch, s2 (write + tail).

use crate::api::{Api, Ctx, parse_stamp, payload, s2_records_body, stamped_payload};
use crate::client::{Conn, SseParser};
use crate::stats::{Recorder, Row, Window};
use anyhow::{Result, bail};
use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub struct Opts {
    pub n: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub payload: usize,
    pub run: String,
}

/// Create `names` with up to 16 connections at once.
async fn create_all(ctx: &Arc<Ctx>, names: &[String], content_type: &'static str) -> Result<()> {
    let mut conn = Conn::new(ctx.target.clone());
    ctx.setup(&mut conn).await?;
    let chunks: Vec<Vec<String>> = names
        .chunks(names.len().div_ceil(16).max(1))
        .map(|c| c.to_vec())
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(ctx.target.clone());
            for name in chunk {
                ctx.create_stream(&mut conn, &name, content_type).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn body_snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(160)]);
    s.replace('\n', " ")
}

// ---------------------------------------------------------------------------------------------
// append

pub async fn append(ctx: Arc<Ctx>, o: Opts) -> Result<Vec<Row>> {
    let names: Vec<String> = (0..o.n).map(|i| format!("{}-a{i}", o.run)).collect();
    create_all(&ctx, &names, "text/plain").await?;
    let window = Window::new(o.warmup, o.duration);
    let mut tasks = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let ctx = ctx.clone();
        let body = payload(o.payload, i);
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = Conn::new(ctx.target.clone());
            let producer = format!("bench-{i}");
            let mut seq: u64 = 0;
            while !window.done() {
                let t0 = Instant::now();
                let req = ctx.append_req(&conn, &name, "text/plain", &body, Some((&producer, seq)));
                match conn.send(req).await {
                    Ok(r) if r.status.is_success() => {
                        seq += 1;
                        if window.measuring(t0) {
                            rec.record(t0.elapsed());
                        }
                    }
                    Ok(r) => {
                        // A producer gap after a lost response: follow the server's expectation.
                        if let Some(exp) = r
                            .header("producer-expected-seq")
                            .and_then(|v| v.parse().ok())
                        {
                            seq = exp;
                        }
                        rec.error(format!("{} {}", r.status, body_snippet(&r.body)));
                    }
                    Err(e) => {
                        rec.error(format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            rec
        }));
    }
    let mut all = Recorder::default();
    for t in tasks {
        all.merge(t.await?);
    }
    Ok(vec![Row::from("append", &all, window.secs())])
}

// ---------------------------------------------------------------------------------------------
// batch

pub async fn batch(ctx: Arc<Ctx>, o: Opts, frames: usize) -> Result<Vec<Row>> {
    let names: Vec<String> = (0..o.n).map(|i| format!("{}-b{i}", o.run)).collect();
    let content_type = if ctx.api == Api::Ds {
        "application/json"
    } else {
        "text/plain"
    };
    create_all(&ctx, &names, content_type).await?;
    let window = Window::new(o.warmup, o.duration);
    let mut tasks = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let ctx = ctx.clone();
        let one = payload(o.payload, i);
        // The whole batch body, built once.
        let (path, ct, body): (String, &str, Bytes) = match ctx.api {
            Api::Bucket | Api::Streamld => {
                let mut b = Vec::with_capacity(frames * (o.payload + 4));
                for _ in 0..frames {
                    b.extend_from_slice(&(one.len() as u32).to_be_bytes());
                    b.extend_from_slice(&one);
                }
                (
                    format!("{}/append-batch", ctx.stream_path(&name)),
                    "text/plain",
                    b.into(),
                )
            }
            Api::Ds => {
                // The base protocol has no batch endpoint: a JSON array appends one message per
                // element in one request, which is the closest equivalent.
                let mut b = Vec::with_capacity(frames * (o.payload + 3));
                b.push(b'[');
                for f in 0..frames {
                    if f > 0 {
                        b.push(b',');
                    }
                    b.push(b'"');
                    b.extend_from_slice(&one[..one.len().saturating_sub(2)]);
                    b.push(b'"');
                }
                b.push(b']');
                (ctx.stream_path(&name), "application/json", b.into())
            }
            Api::S2 => (
                ctx.stream_path(&name),
                "application/json",
                s2_records_body(std::iter::repeat_n(one.as_slice(), frames)),
            ),
        };
        let bytes_per_batch = (frames * o.payload) as u64;
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = Conn::new(ctx.target.clone());
            let basin = ctx.bucket.clone();
            while !window.done() {
                let t0 = Instant::now();
                let mut headers = vec![("content-type", ct)];
                if ctx.api == Api::S2 {
                    headers.push(("s2-basin", basin.as_str()));
                }
                let req = conn.request(Method::POST, &path, &headers, body.clone());
                match conn.send(req).await {
                    Ok(r) if r.status.is_success() => {
                        if matches!(ctx.api, Api::Bucket | Api::Streamld) {
                            let ok = count(&r.body, br#""status":204"#);
                            if ok != frames {
                                rec.error(format!("{} of {frames} frames acknowledged", ok));
                                continue;
                            }
                        }
                        if window.measuring(t0) {
                            rec.record(t0.elapsed());
                            rec.bytes += bytes_per_batch;
                        }
                    }
                    Ok(r) => rec.error(format!("{} {}", r.status, body_snippet(&r.body))),
                    Err(e) => {
                        rec.error(format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            rec
        }));
    }
    let mut all = Recorder::default();
    for t in tasks {
        all.merge(t.await?);
    }
    let mut row = Row::from("batch", &all, window.secs());
    row.records_per_sec = Some(row.ops_per_sec * frames as f64);
    Ok(vec![row])
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

// ---------------------------------------------------------------------------------------------
// replay

pub struct ReplayOpts {
    pub messages: usize,
    pub message_bytes: usize,
    pub streams: usize,
    pub bootstrap: bool,
}

#[derive(Deserialize)]
struct S2Read {
    records: Vec<S2SeqOnly>,
}
#[derive(Deserialize)]
struct S2SeqOnly {
    seq_num: u64,
}

pub async fn replay(ctx: Arc<Ctx>, o: Opts, r: ReplayOpts) -> Result<Vec<Row>> {
    if r.bootstrap && !matches!(ctx.api, Api::Bucket | Api::Streamld) {
        bail!("--bootstrap needs --api bucket");
    }
    let names: Vec<String> = (0..r.streams.max(1))
        .map(|i| format!("{}-r{i}", o.run))
        .collect();
    create_all(&ctx, &names, "text/plain").await?;
    // Fill each stream: `messages` appends of `message_bytes`.
    for (i, name) in names.iter().enumerate() {
        let mut conn = Conn::new(ctx.target.clone());
        let body = payload(r.message_bytes, i);
        for _ in 0..r.messages {
            let req = ctx.append_req(&conn, name, "text/plain", &body, None);
            let resp = conn.send(req).await?;
            if !resp.status.is_success() {
                bail!(
                    "filling {name}: {} {}",
                    resp.status,
                    body_snippet(&resp.body)
                );
            }
        }
    }
    let expect_bytes = (r.messages * r.message_bytes) as u64;
    let window = Window::new(o.warmup, o.duration);
    let mut tasks = Vec::new();
    for c in 0..o.n {
        let ctx = ctx.clone();
        let name = names[c % names.len()].clone();
        let messages = r.messages as u64;
        let bootstrap = r.bootstrap;
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = Conn::new(ctx.target.clone());
            while !window.done() {
                let t0 = Instant::now();
                let got = if bootstrap {
                    read_bootstrap(&ctx, &mut conn, &name).await
                } else if ctx.api == Api::S2 {
                    read_s2(&ctx, &mut conn, &name, messages).await
                } else {
                    read_ds(&ctx, &mut conn, &name).await
                };
                match got {
                    Ok(n) if n >= expect_bytes => {
                        if window.measuring(t0) {
                            rec.record(t0.elapsed());
                            rec.bytes += n;
                        }
                    }
                    Ok(n) => rec.error(format!("short read: {n} of {expect_bytes} bytes")),
                    Err(e) => {
                        rec.error(format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            rec
        }));
    }
    let mut all = Recorder::default();
    for t in tasks {
        all.merge(t.await?);
    }
    let metric = if r.bootstrap { "bootstrap" } else { "replay" };
    Ok(vec![Row::from(metric, &all, window.secs())])
}

/// Catch-up from the start, following `Stream-Next-Offset` until `Stream-Up-To-Date`.
async fn read_ds(ctx: &Ctx, conn: &mut Conn, name: &str) -> Result<u64> {
    let base = ctx.stream_path(name);
    let mut offset = "-1".to_string();
    let mut total = 0u64;
    for _ in 0..10_000 {
        let req = conn.request(
            Method::GET,
            &format!("{base}?offset={offset}"),
            &[],
            Bytes::new(),
        );
        let (resp, len) = conn.send_counting(req).await?;
        if resp.status.as_u16() != 200 {
            bail!("GET {}: {}", offset, resp.status);
        }
        total += len;
        if resp.header("stream-up-to-date").is_some() {
            return Ok(total);
        }
        match resp.header("stream-next-offset") {
            Some(next) if next != offset => offset = next.to_string(),
            _ => bail!("no progress at offset {offset}"),
        }
    }
    bail!("too many chunks")
}

async fn read_bootstrap(ctx: &Ctx, conn: &mut Conn, name: &str) -> Result<u64> {
    let path = format!("{}/bootstrap", ctx.stream_path(name));
    let resp = conn.call(Method::GET, &path, &[], Bytes::new()).await?;
    if resp.status.as_u16() != 200 {
        bail!("bootstrap: {}", resp.status);
    }
    Ok(resp.body.len() as u64)
}

/// Unary S2 reads from seq 0 until `messages` records came back. Counts body bytes as the
/// response size (JSON framing included), so the short-read check is on record count.
async fn read_s2(ctx: &Ctx, conn: &mut Conn, name: &str, messages: u64) -> Result<u64> {
    let base = ctx.stream_path(name);
    let mut next = 0u64;
    let mut total = 0u64;
    while next < messages {
        let path = format!("{base}?seq_num={next}&count={}", messages - next);
        let resp = conn
            .call(
                Method::GET,
                &path,
                &[("accept", "application/json"), ("s2-basin", &ctx.bucket)],
                Bytes::new(),
            )
            .await?;
        if resp.status.as_u16() != 200 {
            bail!(
                "read seq {next}: {} {}",
                resp.status,
                body_snippet(&resp.body)
            );
        }
        let parsed: S2Read = serde_json::from_slice(&resp.body)?;
        match parsed.records.last() {
            Some(last) => next = last.seq_num + 1,
            None => bail!("empty read at seq {next}"),
        }
        total += resp.body.len() as u64;
    }
    Ok(total)
}

// ---------------------------------------------------------------------------------------------
// fanout and s2 (write + tail)

/// Shared between the writers and the subscribers of a live scenario.
struct Live {
    origin: Instant,
    ready: AtomicUsize,
    ready_notify: Notify,
    /// The measuring window, in ns since `origin`, set once every subscriber is ready.
    from_ns: AtomicU64,
    to_ns: AtomicU64,
    stop: AtomicU64,
    stop_notify: Notify,
}

impl Live {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
    fn in_window(&self, sent: u64) -> bool {
        let from = self.from_ns.load(Ordering::Relaxed);
        from != 0 && sent >= from && sent < self.to_ns.load(Ordering::Relaxed)
    }
    fn stop(&self) {
        self.stop.store(1, Ordering::SeqCst);
        self.stop_notify.notify_waiters();
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) != 0
    }
}

#[derive(Deserialize)]
struct S2Batch {
    records: Vec<S2Body>,
}
#[derive(Deserialize)]
struct S2Body {
    #[serde(default)]
    body: String,
}

/// One SSE subscriber from the tail; records receive − send for every stamped message.
async fn subscribe(ctx: Arc<Ctx>, name: String, live: Arc<Live>) -> Recorder {
    let mut rec = Recorder::default();
    let mut conn = Conn::new(ctx.target.clone());
    let mut offset: Option<String> = None;
    let mut marked_ready = false;
    let mark_ready = |marked: &mut bool| {
        if !*marked {
            *marked = true;
            live.ready.fetch_add(1, Ordering::SeqCst);
            live.ready_notify.notify_waiters();
        }
    };
    'outer: while !live.stopped() {
        let req = ctx.sse_req(&conn, &name, offset.as_deref());
        let resp = match conn.send_streaming(req).await {
            Ok(r) if r.status().as_u16() == 200 => r,
            Ok(r) => {
                rec.error(format!("SSE {}", r.status()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => {
                rec.error(format!("SSE connect: {e:#}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut body = resp.into_body();
        let mut parser = SseParser::default();
        // One registration for the whole response, so a delivery costs no timer or waiter.
        let stop = live.stop_notify.notified();
        tokio::pin!(stop);
        stop.as_mut().enable();
        if live.stopped() {
            break;
        }
        loop {
            let frame = if marked_ready {
                tokio::select! {
                    biased;
                    frame = body.frame() => frame,
                    _ = &mut stop => break 'outer,
                }
            } else {
                // Ready on the first event, or 2 s after the headers for a server that sends none.
                match tokio::time::timeout(Duration::from_secs(2), body.frame()).await {
                    Ok(frame) => frame,
                    Err(_) => {
                        mark_ready(&mut marked_ready);
                        continue;
                    }
                }
            };
            let frame = match frame {
                None => break, // the server ended the response: reconnect
                Some(Err(e)) => {
                    if !live.stopped() {
                        rec.error(format!("SSE body: {e}"));
                    }
                    break;
                }
                Some(Ok(f)) => f,
            };
            let now = live.now_ns();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            parser.feed(&data, |ev| {
                mark_ready(&mut marked_ready);
                match (ctx.api, ev.name()) {
                    (Api::S2, b"batch") => {
                        for line in ev.data() {
                            if let Ok(b) = serde_json::from_slice::<S2Batch>(line) {
                                for r in b.records {
                                    note(&mut rec, &live, r.body.as_bytes(), now);
                                }
                            }
                        }
                    }
                    (Api::S2, _) => {}
                    (Api::Streamld, b"event") => {
                        for line in ev.data() {
                            if let Some(body) = json_str_field(line, b"\"payload\":\"") {
                                note(&mut rec, &live, body.as_bytes(), now);
                            }
                            if let Some(sequence) = json_number_field(line, b"\"sequence\":") {
                                offset = Some(sequence);
                            }
                        }
                    }
                    (Api::Streamld, _) => {}
                    (_, b"control") => {
                        if let Some(o) = ev
                            .data()
                            .next()
                            .and_then(|line| json_str_field(line, b"\"streamNextOffset\":\""))
                        {
                            offset = Some(o);
                        }
                    }
                    (_, _) => {
                        for line in ev.data() {
                            note(&mut rec, &live, line, now);
                        }
                    }
                }
            });
            if live.stopped() {
                break 'outer;
            }
        }
        if ctx.api == Api::S2 {
            offset = None;
        }
    }
    rec
}

fn note(rec: &mut Recorder, live: &Live, msg: &[u8], now: u64) {
    if let Some(sent) = parse_stamp(msg).filter(|&sent| live.in_window(sent)) {
        rec.record(Duration::from_nanos(now.saturating_sub(sent)));
    }
}

fn json_str_field(line: &[u8], key: &[u8]) -> Option<String> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let end = line[at..].iter().position(|&b| b == b'"')?;
    Some(String::from_utf8_lossy(&line[at..at + end]).into_owned())
}

fn json_number_field(line: &[u8], key: &[u8]) -> Option<String> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    (digits > 0).then(|| String::from_utf8_lossy(&line[at..at + digits]).into_owned())
}

async fn wait_ready(live: &Live, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let notified = live.ready_notify.notified();
        let have = live.ready.load(Ordering::SeqCst);
        if have >= want || Instant::now() >= deadline {
            return have;
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
    }
}

/// `fanout`: one stream, `n` subscribers, one writer at `rate` events/s.
pub async fn fanout(ctx: Arc<Ctx>, o: Opts, rate: f64) -> Result<Vec<Row>> {
    let name = format!("{}-f", o.run);
    create_all(&ctx, std::slice::from_ref(&name), "text/plain").await?;
    let live = Arc::new(Live {
        origin: Instant::now(),
        ready: AtomicUsize::new(0),
        ready_notify: Notify::new(),
        from_ns: AtomicU64::new(0),
        to_ns: AtomicU64::new(u64::MAX),
        stop: AtomicU64::new(0),
        stop_notify: Notify::new(),
    });
    let mut subs = Vec::new();
    for _ in 0..o.n {
        subs.push(tokio::spawn(subscribe(
            ctx.clone(),
            name.clone(),
            live.clone(),
        )));
    }
    let ready = wait_ready(&live, o.n).await;
    if ready < o.n {
        eprintln!(
            "warning: only {ready} of {} subscribers ready after 60 s",
            o.n
        );
    }
    let now = live.now_ns();
    live.from_ns
        .store(now + o.warmup.as_nanos() as u64, Ordering::SeqCst);
    live.to_ns.store(
        now + (o.warmup + o.duration).as_nanos() as u64,
        Ordering::SeqCst,
    );
    let end = Instant::now() + o.warmup + o.duration;
    let mut wrec = Recorder::default();
    let mut conn = Conn::new(ctx.target.clone());
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent_in_window = 0u64;
    let newline = ctx.api != Api::S2;
    while Instant::now() < end {
        tick.tick().await;
        let sent = live.now_ns();
        let body = stamped_payload(o.payload, sent, newline);
        let t0 = Instant::now();
        let req = ctx.append_req(&conn, &name, "text/plain", &body, None);
        match conn.send(req).await {
            Ok(r) if r.status.is_success() => {
                if live.in_window(sent) {
                    wrec.record(t0.elapsed());
                    sent_in_window += 1;
                }
            }
            Ok(r) => wrec.error(format!("{} {}", r.status, body_snippet(&r.body))),
            Err(e) => wrec.error(format!("{e:#}")),
        }
    }
    // Let the last events arrive, then stop the subscribers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    live.stop();
    let mut all = Recorder::default();
    for s in subs {
        all.merge(s.await?);
    }
    let expected = sent_in_window * o.n as u64;
    let got = all.count();
    if got < expected {
        all.error(format!(
            "{} of {expected} deliveries missing",
            expected - got
        ));
        all.errors += expected - got - 1;
    }
    let secs = o.duration.as_secs_f64();
    Ok(vec![
        Row::from("deliver", &all, secs),
        Row::from("append", &wrec, secs),
    ])
}

/// `s2`: `n` streams, each with a closed-loop writer and one SSE reader from the tail.
pub async fn write_tail(ctx: Arc<Ctx>, o: Opts) -> Result<Vec<Row>> {
    let names: Vec<String> = (0..o.n).map(|i| format!("{}-s{i}", o.run)).collect();
    create_all(&ctx, &names, "text/plain").await?;
    let live = Arc::new(Live {
        origin: Instant::now(),
        ready: AtomicUsize::new(0),
        ready_notify: Notify::new(),
        from_ns: AtomicU64::new(0),
        to_ns: AtomicU64::new(u64::MAX),
        stop: AtomicU64::new(0),
        stop_notify: Notify::new(),
    });
    let subs: Vec<_> = names
        .iter()
        .map(|n| tokio::spawn(subscribe(ctx.clone(), n.clone(), live.clone())))
        .collect();
    let ready = wait_ready(&live, o.n).await;
    if ready < o.n {
        eprintln!("warning: only {ready} of {} readers ready after 60 s", o.n);
    }
    let now = live.now_ns();
    live.from_ns
        .store(now + o.warmup.as_nanos() as u64, Ordering::SeqCst);
    live.to_ns.store(
        now + (o.warmup + o.duration).as_nanos() as u64,
        Ordering::SeqCst,
    );
    let end = Instant::now() + o.warmup + o.duration;
    let newline = ctx.api != Api::S2;
    let writers: Vec<_> = names
        .iter()
        .map(|name| {
            let (ctx, live, name) = (ctx.clone(), live.clone(), name.clone());
            let len = o.payload;
            tokio::spawn(async move {
                let mut rec = Recorder::default();
                let mut conn = Conn::new(ctx.target.clone());
                let mut sent_in_window = 0u64;
                while Instant::now() < end {
                    let sent = live.now_ns();
                    let body = stamped_payload(len, sent, newline);
                    let t0 = Instant::now();
                    let req = ctx.append_req(&conn, &name, "text/plain", &body, None);
                    match conn.send(req).await {
                        Ok(r) if r.status.is_success() => {
                            if live.in_window(sent) {
                                rec.record(t0.elapsed());
                                sent_in_window += 1;
                            }
                        }
                        Ok(r) => rec.error(format!("{} {}", r.status, body_snippet(&r.body))),
                        Err(e) => {
                            rec.error(format!("{e:#}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (rec, sent_in_window)
            })
        })
        .collect();
    let mut wrec = Recorder::default();
    let mut expected = 0;
    for w in writers {
        let (r, s) = w.await?;
        wrec.merge(r);
        expected += s;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    live.stop();
    let mut all = Recorder::default();
    for s in subs {
        all.merge(s.await?);
    }
    let got = all.count();
    if got < expected {
        all.error(format!(
            "{} of {expected} deliveries missing",
            expected - got
        ));
        all.errors += expected - got - 1;
    }
    let secs = o.duration.as_secs_f64();
    Ok(vec![
        Row::from("append", &wrec, secs),
        Row::from("e2e", &all, secs),
    ])
}

// ---------------------------------------------------------------------------------------------
// cost growth: idle streams, catch-up of one large stream

/// Create `n` streams with `conns` connections; report creates/s (the server's memory is read by
/// the caller from outside).
pub async fn idle(ctx: Arc<Ctx>, o: Opts, conns: usize) -> Result<Vec<Row>> {
    let mut conn = Conn::new(ctx.target.clone());
    ctx.setup(&mut conn).await?;
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conns.max(1) {
        let (ctx, next, run) = (ctx.clone(), next.clone(), o.run.clone());
        let n = o.n;
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = Conn::new(ctx.target.clone());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t0 = Instant::now();
                match ctx
                    .create_stream(
                        &mut conn,
                        &format!("{run}-i{i}"),
                        "application/octet-stream",
                    )
                    .await
                {
                    Ok(()) => rec.record(t0.elapsed()),
                    Err(e) => rec.error(format!("{e:#}")),
                }
            }
            rec
        }));
    }
    let mut all = Recorder::default();
    for t in tasks {
        all.merge(t.await?);
    }
    Ok(vec![Row::from(
        "create",
        &all,
        start.elapsed().as_secs_f64(),
    )])
}

/// Fill one stream with `size_mb` MiB in appends of `append_bytes`, then read it from the start
/// `reads` times with one client, following `Stream-Next-Offset`; reports MB/s of the reads.
pub async fn catchup(
    ctx: Arc<Ctx>,
    o: Opts,
    size_mb: usize,
    append_bytes: usize,
    reads: usize,
) -> Result<Vec<Row>> {
    if ctx.api == Api::S2 {
        bail!("catchup drives the Durable Streams faces (--api ds or bucket)");
    }
    let name = format!("{}-c", o.run);
    create_all(
        &ctx,
        std::slice::from_ref(&name),
        "application/octet-stream",
    )
    .await?;
    let append_bytes = append_bytes.max(1);
    let chunk = Bytes::from(payload(append_bytes, 0));
    let appends = (size_mb << 20).div_ceil(append_bytes);
    let fill_start = Instant::now();
    // Fill with a few writers in parallel (order does not matter for a read benchmark).
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (ctx, next, name, chunk) = (ctx.clone(), next.clone(), name.clone(), chunk.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(ctx.target.clone());
            while next.fetch_add(1, Ordering::Relaxed) < appends {
                let req = ctx.append_req(&conn, &name, "application/octet-stream", &chunk, None);
                let r = conn.send(req).await?;
                if !r.status.is_success() {
                    bail!("fill: {} {}", r.status, body_snippet(&r.body));
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let fill_secs = fill_start.elapsed().as_secs_f64();
    let mut fill = Recorder::default();
    fill.bytes = (appends * chunk.len()) as u64;
    let mut fill_row = Row::from("fill", &fill, fill_secs);
    fill_row.count = appends as u64;
    fill_row.ops_per_sec = appends as f64 / fill_secs;
    let mut rec = Recorder::default();
    let mut conn = Conn::new(ctx.target.clone());
    let start = Instant::now();
    for _ in 0..reads.max(1) {
        let t0 = Instant::now();
        let n = read_ds(&ctx, &mut conn, &name).await?;
        rec.record(t0.elapsed());
        rec.bytes += n;
        if n < (appends * chunk.len()) as u64 {
            rec.error(format!("short read: {n} bytes"));
        }
    }
    Ok(vec![
        fill_row,
        Row::from("read", &rec, start.elapsed().as_secs_f64()),
    ])
}
