//! One round trip over loopback in one thread, so that the figure is the CPU the two ends spend
//! (system calls included) rather than two processes' scheduling: a Write with immediate each
//! way through the UDP transport, against the same two bytes each way through plain UDP sockets
//! measured in the same run.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion};
use host_ibverbs::udp::{
    Access, CompletionKind, CompletionQueue, Context, DeviceConfig, MemoryRegion, QpAttr,
    QueuePair, SendWr, WrOp,
};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::Duration;

struct End {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn ends() -> (End, End) {
    let open = || {
        let mut c = DeviceConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
        c.port = 0;
        let ctx = Context::open(&c).expect("open");
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq();
        let qp = pd.create_qp(&cq, &QpAttr::default()).expect("qp");
        let mr = pd
            .reg_mr(4096, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))
            .expect("mr");
        (ctx, cq, qp, mr)
    };
    let (ca, qa_cq, qa, ma) = open();
    let (cb, qb_cq, qb, mb) = open();
    qa.connect(&qb.info()).expect("connect");
    qb.connect(&qa.info()).expect("connect");
    for i in 0..64 {
        qa.post_recv(i, 0, ma.sge(0, 64)).expect("recv");
        qb.post_recv(i, 0, mb.sge(0, 64)).expect("recv");
    }
    (
        End {
            ctx: ca,
            cq: qa_cq,
            qp: qa,
            mr: ma,
        },
        End {
            ctx: cb,
            cq: qb_cq,
            qp: qb,
            mr: mb,
        },
    )
}

/// A Write with immediate from `from` to `to`, driven until `to` sees it.
fn hop(from: &End, to: &End, wcs: &mut Vec<host_ibverbs::udp::WorkCompletion>) {
    from.qp
        .post_send(&SendWr {
            wr_id: 1,
            op: WrOp::WriteWithImm(7),
            stream: 0,
            local: from.mr.sge(0, 2),
            remote: to.mr.remote(0),
        })
        .expect("post");
    loop {
        from.ctx.progress(Duration::ZERO);
        wcs.clear();
        to.cq.poll(wcs, 16);
        if wcs.iter().any(|c| c.kind == CompletionKind::RecvWriteImm) {
            break;
        }
    }
    to.qp.post_recv(1, 0, to.mr.sge(0, 64)).expect("recv");
    // The sender's own completions (its Write, acknowledged) are drained as they come.
    wcs.clear();
    from.cq.poll(wcs, 64);
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_round_trip_2_bytes");
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    a.set_nonblocking(true).expect("nonblocking");
    b.set_nonblocking(true).expect("nonblocking");
    let (aa, ba) = (a.local_addr().expect("addr"), b.local_addr().expect("addr"));
    let mut buf = [0u8; 2048];
    g.bench_function("udp_sockets_baseline", |bench| {
        bench.iter(|| {
            a.send_to(&[1, 2], ba).expect("send");
            while b.recv_from(&mut buf).is_err() {}
            b.send_to(&[1, 2], aa).expect("send");
            while a.recv_from(&mut buf).is_err() {}
        })
    });
    let (x, y) = ends();
    let mut wcs = Vec::new();
    g.bench_function("metaroce_write_with_imm", |bench| {
        bench.iter(|| {
            hop(&x, &y, &mut wcs);
            hop(&y, &x, &mut wcs);
        })
    });
    g.finish();
}

/// What a spinning end pays for one look when nothing has arrived: a poll of the completion
/// queue, which runs the engine's round when the queue is empty (as the tools poll), against an empty
/// `recv_from` on a plain UDP socket measured in the same run. Half of a round is what an arrival
/// waits, on average, before the loop that spins for it notices it.
fn empty_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("empty_poll");
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 2048];
    g.bench_function("udp_recv_from_baseline", |bench| {
        bench.iter(|| assert!(s.recv_from(&mut buf).is_err()))
    });
    // The same empty look through recvmsg(2) with a source address, one iovec and room for
    // control messages, as the engine's receive call asks (the kernel copies the header and
    // the iovec in on every call, which recvfrom(2) does not).
    g.bench_function("udp_recvmsg_with_control", |bench| {
        use std::os::fd::AsRawFd;
        let mut name: libc::sockaddr_storage = unsafe_zeroed();
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        bench.iter(|| {
            let mut h: libc::msghdr = unsafe_zeroed();
            h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = control.as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: the header points at `name`, `iov` (over `buf`) and `control`, all live
            // for the call.
            let r = unsafe { libc::recvmsg(s.as_raw_fd(), &mut h, libc::MSG_DONTWAIT) };
            assert!(r < 0);
        })
    });
    let (x, _y) = ends();
    let mut wcs = Vec::new();
    // Settle the connection's start (its first probes and timers) before timing.
    for _ in 0..1000 {
        x.cq.poll(&mut wcs, 16);
    }
    g.bench_function("metaroce_cq_poll", |bench| {
        bench.iter(|| {
            wcs.clear();
            x.cq.poll(&mut wcs, 16);
            assert!(wcs.is_empty());
        })
    });
    g.finish();
}

/// A zeroed C structure (`msghdr`, `sockaddr_storage`: plain integers and pointers).
fn unsafe_zeroed<T: Copy>() -> T {
    // SAFETY: only called for C structures of integers and raw pointers, for which all zero
    // bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

criterion_group!(benches, round_trip, empty_poll);
criterion_main!(benches);
