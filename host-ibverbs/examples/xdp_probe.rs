//! What AF_XDP would buy the UDP transport on the machine at hand, measured without the transport:
//! a ping-pong and a bulk sender and receiver of UDP datagrams through the transport's AF_XDP
//! datapath alone (`host_ibverbs::udp::xdp::Xdp`: an AF_XDP socket in copy mode, its XDP program,
//! frames built and checked there), with no connection, to run beside `udp_pingpong` and
//! `udp_ceiling` over the same interface (`scripts/bench-xdp.sh`: two namespaces joined by a veth
//! pair).
//!
//! ```text
//! xdp_probe server LOCAL_IP:PORT                              # answers every datagram to PORT
//! xdp_probe client LOCAL_IP:PORT PEER_IP:PORT SIZE ITERATIONS # one JSON line, half round trips
//! xdp_probe recv LOCAL_IP:PORT SECONDS                        # one JSON line: Gb/s of UDP payload
//! xdp_probe send LOCAL_IP:PORT PEER_IP:PORT SIZE SECONDS
//! ```
//!
//! Each end opens the datapath on the interface holding LOCAL_IP (driver-mode XDP: a veth runs it
//! in the NAPI poll of its receive queue), whose program hands the unfragmented IPv4 UDP frames for
//! that address and port to the socket and passes every other frame to the kernel's stack.
//! Datagrams leave through the socket's TX ring with a `sendto` that asks the kernel to send them
//! (copy mode: the kernel copies each into an skb and transmits it); they arrive in the RX ring,
//! read in user space without a system call (the kernel copies each into the socket's memory in the
//! softirq that received it, which on a veth runs on the sending CPU). Frames go to the broadcast
//! MAC (the peer's program takes them before any MAC check). SIZE is the UDP payload. Only for
//! Linux, as root, on an interface with one receive queue and XDP in its driver (not `lo`). A
//! client that has no answer after 100 ms sends its ping again and counts it lost (`lost`).

use host_ibverbs::udp::xdp::Xdp;
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};
use transport_core::wire::MacAddr;

const BROADCAST: MacAddr = MacAddr([0xff; 6]);

/// Queues `msg` to `peer` from `local`'s port (to the broadcast MAC).
fn queue(x: &mut Xdp, local: SocketAddrV4, peer: SocketAddrV4, msg: &[u8]) {
    x.send(
        BROADCAST,
        local.port(),
        peer,
        &mut std::iter::once(msg),
        msg.len(),
    );
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("{what} expected (see the usage at the top of examples/xdp_probe.rs)");
        std::process::exit(2)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    let local: SocketAddrV4 = arg(&args, 2, "LOCAL_IP:PORT");
    let mut x = Xdp::open(local, 0).unwrap_or_else(|e| {
        eprintln!("the AF_XDP datapath on {local}: {e}");
        std::process::exit(1)
    });
    match mode {
        "server" => {
            let mut answers: Vec<(SocketAddrV4, Vec<u8>)> = Vec::new();
            loop {
                answers.clear();
                x.receive(64, &mut |meta, d| {
                    if let Some(SocketAddr::V4(from)) = meta.src {
                        answers.push((from, d.to_vec()));
                    }
                });
                let stop = answers.iter().any(|(_, d)| d.len() == 1);
                for (to, d) in &answers {
                    queue(&mut x, local, *to, d);
                }
                x.kick();
                if stop {
                    return;
                }
            }
        }
        "client" => {
            let peer: SocketAddrV4 = arg(&args, 3, "PEER_IP:PORT");
            let size: usize = arg(&args, 4, "SIZE");
            let iters: usize = arg(&args, 5, "ITERATIONS");
            let msg = vec![0x5au8; size.max(2)];
            let mut samples = Vec::with_capacity(iters);
            let mut lost = 0u64;
            while samples.len() < iters {
                let t0 = Instant::now();
                queue(&mut x, local, peer, &msg);
                x.kick();
                let mut spins = 0u32;
                let answered = loop {
                    if x.receive(1, &mut |_, _| {}) > 0 {
                        break true;
                    }
                    spins = spins.wrapping_add(1);
                    if spins % 4096 == 0 && t0.elapsed() > Duration::from_millis(100) {
                        break false;
                    }
                };
                if answered {
                    samples.push(t0.elapsed().as_nanos() as f64 / 2000.0);
                } else {
                    lost += 1;
                }
            }
            queue(&mut x, local, peer, &[0]);
            x.kick();
            std::thread::sleep(Duration::from_millis(50));
            samples.sort_by(f64::total_cmp);
            let q = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
            println!(
                "{{\"bytes\":{size},\"iterations\":{iters},\"lost\":{lost},\"t_min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3}}}",
                samples[0],
                q(0.5),
                q(0.99),
                q(0.999)
            );
        }
        "recv" => {
            let secs: f64 = arg(&args, 3, "SECONDS");
            let (mut frames, mut bytes) = (0u64, 0u64);
            let mut first: Option<Instant> = None;
            let mut last = Instant::now();
            let end = Instant::now() + Duration::from_secs_f64(secs + 5.0);
            loop {
                let n = x.receive(64, &mut |_, d| {
                    bytes += d.len() as u64;
                    std::hint::black_box(d.first());
                });
                if n == 0 {
                    if Instant::now() > end
                        || (first.is_some() && last.elapsed() > Duration::from_millis(300))
                    {
                        break;
                    }
                    continue;
                }
                last = Instant::now();
                first.get_or_insert(last);
                frames += n as u64;
            }
            let t = first.map_or(0.0, |f| (last - f).as_secs_f64());
            println!(
                "{{\"frames\":{frames},\"bytes\":{bytes},\"seconds\":{t:.3},\"gbps\":{:.3}}}",
                if t > 0.0 {
                    bytes as f64 * 8.0 / t / 1e9
                } else {
                    0.0
                }
            );
        }
        "send" => {
            let peer: SocketAddrV4 = arg(&args, 3, "PEER_IP:PORT");
            let size: usize = arg(&args, 4, "SIZE");
            let secs: f64 = arg(&args, 5, "SECONDS");
            let msg = vec![0x5au8; size.max(1)];
            let end = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < end {
                for _ in 0..64 {
                    queue(&mut x, local, peer, &msg);
                }
                x.kick();
            }
        }
        _ => {
            eprintln!("usage: xdp_probe server|client|recv|send ... (see examples/xdp_probe.rs)");
            std::process::exit(2);
        }
    }
}
