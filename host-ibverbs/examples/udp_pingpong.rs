//! The latency baseline for `metaroce write-lat`: a plain UDP ping-pong of the same size between
//! two processes, spinning on non-blocking sockets as the tool's completion polling does, and
//! reporting half the round trip as perftest does.
//!
//! ```text
//! udp_pingpong server PORT
//! udp_pingpong client HOST:PORT SIZE ITERATIONS     # prints one JSON line
//! ```

use std::net::UdpSocket;
use std::time::Instant;

fn spin_recv(s: &UdpSocket, buf: &mut [u8]) -> usize {
    loop {
        match s.recv(buf) {
            Ok(n) => return n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("recv: {e}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let port = args.get(2).map_or("18700", String::as_str);
            let s = UdpSocket::bind(format!("0.0.0.0:{port}")).expect("bind");
            s.set_nonblocking(true).expect("nonblocking");
            let mut buf = vec![0u8; 65536];
            loop {
                let (n, from) = loop {
                    match s.recv_from(&mut buf) {
                        Ok(x) => break x,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::hint::spin_loop()
                        }
                        Err(e) => panic!("recv: {e}"),
                    }
                };
                if n == 1 && buf[0] == 0xff {
                    return;
                }
                s.send_to(&buf[..n], from).expect("send");
            }
        }
        Some("client") => {
            let peer = &args[2];
            let size: usize = args[3].parse().expect("size");
            let iters: usize = args[4].parse().expect("iterations");
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
            s.connect(peer).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            let msg = vec![0x5au8; size.max(2)];
            let mut buf = vec![0u8; 65536];
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t0 = Instant::now();
                s.send(&msg).expect("send");
                spin_recv(&s, &mut buf);
                samples.push(t0.elapsed().as_nanos() as f64 / 2000.0);
            }
            let _ = s.send(&[0xff]);
            samples.sort_by(f64::total_cmp);
            let p = |q: f64| {
                samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1]
            };
            println!(
                "{{\"bytes\":{size},\"iterations\":{iters},\"t_min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3},\"t_max_us\":{:.3}}}",
                samples[0],
                p(0.5),
                p(0.99),
                p(0.999),
                samples[samples.len() - 1]
            );
        }
        _ => {
            eprintln!("usage: udp_pingpong server PORT | client HOST:PORT SIZE ITERATIONS");
            std::process::exit(2);
        }
    }
}
