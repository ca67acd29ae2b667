//! The bodies of the fuzz targets, shared by the libFuzzer binaries in `fuzz_targets/` and by the
//! stable test that replays the corpora (`tests/replay.rs`). Each body panics only when a property
//! fails: parsing must never panic, and whatever parses must emit and parse back to itself.

use transport_core::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr,
};
use transport_core::wire::{parse_with, IcrcCheck, ParseOptions};

/// A whole frame: parse with every check, and with the ICRC only reported; re-emit what parses.
pub fn frame(data: &[u8]) {
    let _ = transport_core::wire::parse(data);
    let opts = ParseOptions {
        icrc: IcrcCheck::Report,
        ..ParseOptions::default()
    };
    let Ok(parsed) = parse_with(data, &opts) else {
        return;
    };
    let repr = parsed.repr;
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("a parsed frame emits");
    let again = transport_core::wire::parse(&buf[..n]).expect("an emitted frame parses");
    assert_eq!(again.repr, repr);
    assert_eq!(again.icrc_ok(), Some(true));
}

macro_rules! header_target {
    ($(#[$doc:meta])* $name:ident, $repr:ty) => {
        $(#[$doc])*
        pub fn $name(data: &[u8]) {
            let Ok((repr, rest)) = <$repr>::parse(data) else { return };
            assert_eq!(rest.len(), data.len() - <$repr>::LEN);
            let mut buf = [0u8; <$repr>::LEN];
            repr.emit(&mut buf).expect("a parsed header emits");
            assert_eq!(<$repr>::parse(&buf).expect("an emitted header parses").0, repr);
        }
    };
}

header_target!(
    /// The MetaRoCE data header, and the remote header after it.
    mr_data_header,
    MrDataRepr
);
header_target!(
    /// The MetaRoCE remote header.
    mr_remote,
    MrRemoteRepr
);
header_target!(
    /// The MetaRoCE ACK header.
    mr_ack,
    MrAckRepr
);
header_target!(
    /// The MetaRoCE NACK header.
    mr_nack,
    MrNackRepr
);
header_target!(
    /// The MetaRoCE probe header.
    mr_probe,
    MrProbeRepr
);

/// The data header followed by a remote header, as on a Write.
pub fn mr_data(data: &[u8]) {
    mr_data_header(data);
    if let Some(rest) = data.get(MrDataRepr::LEN..) {
        mr_remote(rest);
    }
}

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target by name, for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("mr_data", mr_data),
    ("mr_ack", mr_ack),
    ("mr_nack", mr_nack),
    ("mr_probe", mr_probe),
];
