//! The sessions: a client's run against a server, and a server's run for each client (and its
//! worker connections), over the connection exchange.

use super::*;

/// Runs the client side: connects, runs every phase, returns one report per size. With
/// `threads` > 1, each worker thread runs its own exchange, device and share of the
/// connections, and the reports are added up per size.
pub fn run_client(
    cfg: &PerfConfig,
    mut on_report: impl FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    validate(cfg)?;
    // The workers of one client show the server the same session number, so that nobody else
    // can join the session as a worker.
    let session = crate::udp::random_u64();
    if cfg.threads <= 1 {
        return run_client_one(cfg, 1, session, on_report);
    }
    let t = cfg.threads;
    let workers: Vec<_> = (0..t)
        .map(|w| {
            let mut c = cfg.clone();
            c.qps = cfg.qps / t + u32::from(w < cfg.qps % t);
            c.threads = 1;
            c.max_memory = cfg.max_memory / u64::from(t);
            c.progress = cfg.progress && w == 0;
            c.publish_stats = cfg.publish_stats && w == 0;
            std::thread::Builder::new()
                .name(format!("worker{w}"))
                .stack_size(64 << 20)
                .spawn(move || run_client_one(&c, t, session, |_| {}))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| PerfError::Invalid(format!("cannot start a worker thread: {e}")))?;
    let mut all = Vec::new();
    for w in workers {
        let r = w
            .join()
            .map_err(|_| PerfError::Invalid("a worker thread panicked".into()))??;
        all.push(r);
    }
    let merged: Vec<Report> = (0..all[0].len())
        .map(|i| {
            let parts: Vec<&BwResult> = all
                .iter()
                .filter_map(|r| match r.get(i) {
                    Some(Report::Bw(b)) => Some(b),
                    _ => None,
                })
                .collect();
            Report::Bw(BwResult::sum(&parts))
        })
        .collect();
    for r in &merged {
        on_report(r);
    }
    Ok(merged)
}

/// The peer's data address, which must be the address its control connection comes from
/// (unless `--allow-data-redirect`): a peer cannot have this end send its data to a third host.
pub(super) fn check_data_address(
    cfg: &PerfConfig,
    chan: &Channel,
    data: &str,
) -> Result<(), PerfError> {
    if cfg.transport != Transport::Udp || cfg.allow_data_redirect {
        return Ok(());
    }
    let addr: std::net::SocketAddr = data
        .parse()
        .map_err(|_| OobError::Field(format!("data address {data:?}")))?;
    let peer = chan.peer_addr().map_err(OobError::Io)?.ip().to_canonical();
    if addr.ip().to_canonical() != peer {
        return Err(PerfError::Mismatch(format!(
            "the peer asks for its data at {addr}, but its control connection comes from {peer} \
             (--allow-data-redirect on this end permits a data path on another address)"
        )));
    }
    Ok(())
}

pub(super) fn run_client_one(
    cfg: &PerfConfig,
    workers: u32,
    session: u64,
    mut on_report: impl FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    validate(cfg)?;
    let host = cfg.server.clone().unwrap_or_default();
    let mut chan = Channel::connect(&host, cfg.port, Duration::from_secs(5))?;
    let local_ip = cfg
        .bind
        .unwrap_or(chan.local_addr().map_err(OobError::Io)?.ip().to_canonical());
    // The ICRC goes resolved too: the server runs the client's choice, or, when the client left
    // it to the address and the server keeps it (its --icrc or --pcap), the server's answer.
    let peer_ip = chan.peer_addr().map_err(OobError::Io)?.ip();
    let icrc_auto = cfg.icrc.is_none();
    let mut resolved = cfg.clone();
    resolved.icrc = Some(super::icrc_for(cfg, local_ip, peer_ip));
    let cfg = &resolved;
    // The windows go resolved: the server takes the client's, whatever its own payload.
    let payload = super::packet_mtu(cfg.mtu, local_ip).unwrap_or(udp::QpAttr::default().mtu);
    let (window, start_window) = super::windows(cfg, payload);
    // The server opens its device first (so it gets the data port it asks for, 4791 by
    // default, even when both ends share a host); the client then takes the same port if it is
    // free, any other if not, and sends its queue pairs.
    let mut hello = Message::new("hello")
        .with("test", cfg.test.name())
        .with("transport", cfg.transport.name())
        .with("qps", cfg.qps)
        .with("paths", cfg.paths)
        .with("window", window)
        .with("start_window", start_window)
        .with("payload", payload)
        .with("icrc", icrc_name(cfg.icrc.unwrap_or_default()))
        .with("cc", cfg.cc.name())
        .with("busy", u8::from(cfg.busy_poll))
        .with("workers", workers)
        .with("session", session);
    if let Some(d) = cfg.duration {
        hello = hello.with("duration_ms", d.as_millis());
    }
    if icrc_auto {
        hello = hello.with("icrc_auto", 1);
    }
    chan.send(&hello)?;
    let reply = chan.expect("hello", Some(MESSAGE_TIMEOUT))?;
    let (peer_data, peer_qps) = (reply.text("data")?, reply.text("qp")?);
    check_data_address(cfg, &chan, peer_data)?;
    resolved.icrc = Some(super::icrc_after_answer(
        resolved.icrc.unwrap_or_default(),
        icrc_auto,
        reply.text("icrc").ok(),
    ));
    let cfg = &resolved;
    let ep = Endpoint::open(cfg, local_ip, true)?;
    let (data, qps) = ep.local_info();
    chan.send(&Message::new("qps").with("data", data).with("qp", qps))?;
    ep.connect(peer_data, peer_qps)?;
    chan.start_heartbeat()?;
    let mut reports = Vec::new();
    for size in cfg.sizes() {
        let r = run::client_phase(cfg, &ep, &mut chan, size)?;
        on_report(&r);
        reports.push(r);
    }
    chan.send(&Message::new("bye"))?;
    ep.finish()?;
    Ok(reports)
}

/// What a server did for one client.
#[derive(Debug, Clone)]
pub struct Served {
    /// The client's test.
    pub test: Test,
    /// Phases run.
    pub phases: u32,
    /// Whether everything the server checked was right.
    pub verified: bool,
    /// What the first failed check found, when one failed.
    pub why: Option<String>,
    /// Bytes the server checked.
    pub bytes_checked: u64,
    /// The server's counters at the end (`metaroce stats --json` format).
    pub stats: serde_json::Value,
}

impl Served {
    /// The workers' results as one: phases of the slowest, all verified, bytes and counters
    /// added (device counters summed, connections listed together).
    fn sum(parts: Vec<Served>) -> Served {
        let mut out = Served {
            test: parts[0].test,
            phases: parts.iter().map(|p| p.phases).max().unwrap_or(0),
            verified: parts.iter().all(|p| p.verified),
            why: parts.iter().find_map(|p| p.why.clone()),
            bytes_checked: parts.iter().map(|p| p.bytes_checked).sum(),
            stats: parts[0].stats.clone(),
        };
        for p in &parts[1..] {
            if let (Some(dev), Some(more)) = (
                out.stats["device"].as_object_mut(),
                p.stats["device"].as_object(),
            ) {
                for (k, v) in more {
                    let sum =
                        dev.get(k).and_then(|x| x.as_u64()).unwrap_or(0) + v.as_u64().unwrap_or(0);
                    dev.insert(k.clone(), sum.into());
                }
            }
            if let (Some(qps), Some(more)) =
                (out.stats["qps"].as_array_mut(), p.stats["qps"].as_array())
            {
                qps.extend(more.iter().cloned());
            }
        }
        out
    }
}

/// Most worker connections one client may run.
pub(super) const MAX_WORKERS: u32 = 64;

/// Runs the server side for one client on `listener` (and, when the client runs several worker
/// threads, for each of its workers, each in a thread with its own device).
///
/// A connection that fails before its hello is accepted (no valid hello within the set-up time,
/// a hello this server cannot serve, a connection reset while it waited) is answered with an
/// error where possible and returned as [`PerfError::NoSession`]. Every failure after that is
/// the session's. Every worker thread has ended when this returns.
pub fn serve_one(cfg: &PerfConfig, listener: &TcpListener) -> Result<Served, PerfError> {
    let no_session = |e: PerfError| PerfError::NoSession(Box::new(e));
    let mut chan = Channel::accept(listener).map_err(|e| no_session(e.into()))?;
    let setup_until = Instant::now() + SETUP_TIMEOUT;
    let first = chan
        .expect("hello", Some(MESSAGE_TIMEOUT))
        .map_err(PerfError::from)
        .and_then(|h| session_config(cfg, &h));
    let mine = match first {
        Ok(x) => x,
        Err(e) => {
            chan.send_error(&e.to_string());
            return Err(no_session(e));
        }
    };
    let workers = mine.workers;
    if workers == 1 {
        return serve_logged(&mine.cfg, chan, 1, setup_until);
    }
    // The other workers: connections from the same host that name the same session, until all
    // have come or the set-up time is over; anybody else is told the server is busy.
    let session = mine.session;
    let peer_ip = chan.peer_addr().map_err(OobError::Io)?.ip().to_canonical();
    let mut joined = vec![(chan, mine.cfg)];
    while joined.len() < workers as usize {
        let mut c = match Channel::accept_until(listener, setup_until) {
            Ok(c) => c,
            Err(e) => {
                for (c, _) in &mut joined {
                    c.send_error(&format!("not every worker came: {e}"));
                }
                return Err(PerfError::Oob(e));
            }
        };
        let same_host = c
            .peer_addr()
            .is_ok_and(|a| a.ip().to_canonical() == peer_ip);
        let left = setup_until.saturating_duration_since(Instant::now());
        let worker = c
            .expect("hello", Some(left.min(MESSAGE_TIMEOUT)))
            .map_err(PerfError::from)
            .and_then(|h| session_config(cfg, &h));
        match worker {
            Ok(w) if same_host && w.session == session && w.workers == workers => {
                joined.push((c, w.cfg))
            }
            Ok(_) => c.send_error("busy: this server is serving another client"),
            Err(e) => c.send_error(&e.to_string()),
        }
    }
    let mut threads = Vec::new();
    for (w, (chan, mut c)) in joined.into_iter().enumerate() {
        c.publish_stats = cfg.publish_stats && w == 0;
        let t = std::thread::Builder::new()
            .name(format!("server{w}"))
            .stack_size(64 << 20)
            .spawn(move || serve_logged(&c, chan, workers, setup_until));
        match t {
            Ok(t) => threads.push(t),
            // The workers started end on their own: their client cannot run without this one.
            Err(e) => {
                return Err(PerfError::Invalid(format!(
                    "cannot start a worker thread: {e}"
                )))
            }
        }
    }
    // Every worker is waited for, also after one failed (a worker whose client stopped
    // driving it ends at its own deadline), so that none outlives the session.
    let mut parts = Vec::new();
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(s)) => parts.push(s),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(PerfError::Invalid("a worker thread panicked".into()));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Served::sum(parts)),
    }
}

/// What a client's hello asks of this server, checked.
pub(super) struct SessionConfig {
    /// This end's configuration for the session (or for one of its workers).
    pub(super) cfg: PerfConfig,
    /// Worker connections of the client.
    pub(super) workers: u32,
    /// The number its workers name (0 when it has one).
    pub(super) session: u64,
}

/// Checks a hello against what this server runs and against the limits, before anything is
/// opened for it.
pub(super) fn session_config(
    cfg: &PerfConfig,
    hello: &Message,
) -> Result<SessionConfig, PerfError> {
    let test_name = hello.text("test")?;
    let test = Test::from_name(test_name)
        .ok_or_else(|| PerfError::Mismatch(format!("unknown test {test_name:?}")))?;
    if test != cfg.test {
        return Err(PerfError::Mismatch(format!(
            "the server runs {}, the client asked for {}",
            cfg.test.name(),
            test.name()
        )));
    }
    // A client from before the field existed speaks udp.
    let transport = hello.text("transport").unwrap_or("udp");
    if transport != cfg.transport.name() {
        return Err(PerfError::Mismatch(format!(
            "the server runs over {}, the client asked for {transport}",
            cfg.transport.name()
        )));
    }
    let workers: u32 = hello.get("workers")?;
    if workers == 0 || workers > MAX_WORKERS {
        return Err(PerfError::Invalid(format!(
            "workers={workers}: 1 to {MAX_WORKERS}"
        )));
    }
    let session = if workers > 1 {
        hello.get("session")?
    } else {
        0
    };
    let mut mine = cfg.clone();
    // The client decides how many workers there are; each server thread serves one of them,
    // with its share of the memory.
    mine.threads = 1;
    mine.max_memory = cfg.max_memory / u64::from(workers);
    mine.qps = hello.get("qps")?;
    mine.paths = hello.get("paths")?;
    mine.window = Some(hello.get("window")?);
    // A client from before the field existed: the server's own payload.
    mine.peer_payload = if hello.text("payload").is_ok() {
        Some(hello.get("payload")?)
    } else {
        None
    };
    // A client from before the field existed starts at its window.
    mine.start_window = if hello.text("start_window").is_ok() {
        Some(hello.get("start_window")?)
    } else {
        mine.window
    };
    // A client from before the field existed runs ECN AIMD.
    let cc = hello.text("cc").unwrap_or("ecn-aimd");
    mine.cc = Cc::from_name(cc)
        .ok_or_else(|| PerfError::Mismatch(format!("unknown rate controller {cc:?}")))?;
    // A client from before the field existed sends and checks the ICRC.
    mine.icrc = match hello.text("icrc").unwrap_or("full") {
        "full" => Some(udp::IcrcMode::Full),
        "off" => Some(udp::IcrcMode::Off),
        other => {
            return Err(PerfError::Mismatch(format!(
                "unknown ICRC mode {other:?} (full or off)"
            )))
        }
    };
    // This end keeps the ICRC when told to (--icrc), when it writes a capture, or when its
    // arrivals come through AF_XDP (no UDP checksum checked there): over a mode
    // the client left to the address (on one host) it wins, and says so in its answer; against
    // a client's --no-icrc it refuses.
    let keeps = cfg.icrc == Some(udp::IcrcMode::Full) || cfg.pcap.is_some() || cfg.xdp;
    if keeps && mine.icrc == Some(udp::IcrcMode::Off) {
        if hello.text("icrc_auto").is_ok() {
            mine.icrc = Some(udp::IcrcMode::Full);
        } else {
            return Err(PerfError::Mismatch(
                "the client turns the ICRC off (--no-icrc), and this server keeps it (--icrc, \
                 --pcap or --xdp)"
                    .into(),
            ));
        }
    }
    mine.duration = match hello.text("duration_ms") {
        Ok(_) => Some(Duration::from_millis(hello.get("duration_ms")?)),
        Err(_) => None,
    };
    validate(&mine)?;
    Ok(SessionConfig {
        cfg: mine,
        workers,
        session,
    })
}

pub(super) fn serve_logged(
    mine: &PerfConfig,
    mut chan: Channel,
    workers: u32,
    setup_until: Instant,
) -> Result<Served, PerfError> {
    let r = serve_channel(mine, &mut chan, workers, setup_until);
    if let Err(e) = &r {
        chan.send_error(&e.to_string());
    }
    r
}

/// Serves one (worker) connection whose hello `session_config` accepted as `mine`.
pub(super) fn serve_channel(
    mine: &PerfConfig,
    chan: &mut Channel,
    workers: u32,
    setup_until: Instant,
) -> Result<Served, PerfError> {
    let local_ip = mine
        .bind
        .unwrap_or(chan.local_addr().map_err(OobError::Io)?.ip().to_canonical());
    // Several workers share the host: the first takes the data port, the others any port.
    let ep = Endpoint::open(mine, local_ip, workers > 1)?;
    let (data, qps) = ep.local_info();
    chan.send(
        &Message::new("hello")
            .with("data", data)
            .with("qp", qps)
            .with("icrc", icrc_name(mine.icrc.unwrap_or_default())),
    )?;
    let left = setup_until.saturating_duration_since(Instant::now());
    let qps = chan.expect("qps", Some(left.min(MESSAGE_TIMEOUT)))?;
    check_data_address(mine, chan, qps.text("data")?)?;
    ep.connect(qps.text("data")?, qps.text("qp")?)?;
    chan.start_heartbeat()?;
    let mut served = Served {
        test: mine.test,
        phases: 0,
        verified: true,
        why: None,
        bytes_checked: 0,
        stats: serde_json::Value::Null,
    };
    loop {
        let m = run::next_message(&ep, chan, PHASE_GAP)?;
        match m.verb.as_str() {
            "go" => {
                let (bytes, why) = run::server_phase(mine, &ep, chan, &m)?;
                served.phases += 1;
                served.verified &= why.is_none();
                served.why = served.why.take().or(why);
                served.bytes_checked += bytes;
            }
            "bye" => {
                served.stats = ep.stats_json(&format!("metaroce {} server", mine.test.name()));
                break;
            }
            other => {
                return Err(PerfError::Invalid(format!("unexpected {other}")));
            }
        }
    }
    ep.finish()?;
    Ok(served)
}
