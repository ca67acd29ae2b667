//! A runner that hands the kernel a datagram in pieces (the headers, the payload where it lies in
//! registered memory, the pad and ICRC) seals it through `Connection::seal_parts`: the same bytes
//! as `Connection::seal` over the datagram laid out whole, for every packet of a message with and
//! without a pad, on both ICRC settings a connection can have.

mod common;

use common::{config, write_at, Conn, BASE, MEM};
use transport_core::conn::{IcrcMode, Memory};

fn pieces_equal_whole(icrc: IcrcMode) {
    let mut cfg = config(1, 2);
    cfg.icrc = icrc;
    let mut a = Conn::new(cfg);
    let mut mem: Vec<u8> = (0..MEM).map(|i| (i * 7 + 3) as u8).collect();
    let m = transport_core::conn::FlatMemory {
        base: BASE,
        bytes: &mut mem,
    };
    let now = transport_core::time::Instant::ZERO;
    // 10,001 bytes: packets of the MTU and a last one that needs a pad.
    a.post(now, write_at(1, 0, 10_001, 0x51)).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut n = 0;
    while let Some(tx) = a.poll_transmit(now, &mut buf) {
        let mut whole = buf.clone();
        assert!(a.fill_and_seal(&tx, &mut whole, &m));
        let payload = m.read(tx.payload_addr, tx.payload_len).unwrap_or(&[]);
        let mut trailer = [0u8; 7];
        let t = tx.len - tx.header_len - tx.payload_len;
        a.seal_parts(&tx, &buf[..tx.header_len], payload, &mut trailer[..t]);
        let mut pieces = buf[..tx.header_len].to_vec();
        pieces.extend_from_slice(payload);
        pieces.extend_from_slice(&trailer[..t]);
        assert_eq!(pieces, whole[..tx.len], "packet {n}");
        n += 1;
    }
    assert!(n >= 3, "{n} packets");
}

#[test]
fn sealing_in_pieces_gives_the_datagram_sealing_whole_gives() {
    pieces_equal_whole(IcrcMode::Full);
    pieces_equal_whole(IcrcMode::Off);
}
