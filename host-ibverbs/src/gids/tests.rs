//! The reader and the GID choice against a copy of the sysfs layout
//! (`tests/fixtures/sysfs-infiniband`, its provenance beside it).

use super::*;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-infiniband")
}

fn device(name: &str) -> RdmaDevice {
    read_devices(&fixture())
        .unwrap()
        .into_iter()
        .find(|d| d.name == name)
        .unwrap()
}

#[test]
fn the_table_reads_as_show_gids_lists_it() {
    let devs = read_devices(&fixture()).unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["mlx4_0", "mlx5_0", "mlx5_1", "mlx5_2"]);
    let p = &device("mlx5_0").ports[0];
    assert_eq!(
        (p.num, p.link_layer, p.is_active()),
        (1, LinkLayer::Ethernet, true)
    );
    // Six used entries; the all-zero ones are left out.
    let rows: Vec<(u8, Option<GidType>, String)> = p
        .gids
        .iter()
        .map(|g| {
            (
                g.index,
                g.kind,
                g.to_string().split_whitespace().nth(1).unwrap().to_string(),
            )
        })
        .collect();
    let v1 = Some(GidType::IbRoceV1);
    let v2 = Some(GidType::RoceV2);
    assert_eq!(
        rows,
        [
            (0, v1, "fe80::a2b:3cff:fe4d:5e6f".to_string()),
            (1, v2, "fe80::a2b:3cff:fe4d:5e6f".to_string()),
            (2, v1, "::ffff:192.168.10.21".to_string()),
            (3, v2, "::ffff:192.168.10.21".to_string()),
            (4, v1, "2001:db8:10::21".to_string()),
            (5, v2, "2001:db8:10::21".to_string()),
        ]
    );
    assert!(p
        .gids
        .iter()
        .all(|g| g.netdev.as_deref() == Some("enp65s0f0")));
    assert_eq!(
        p.gids[3].ipv4(),
        Some(std::net::Ipv4Addr::new(192, 168, 10, 21))
    );
    assert!(p.gids[0].is_link_local() && !p.gids[3].is_link_local());
}

#[test]
fn the_default_is_the_ipv4_roce_v2_gid_not_index_0() {
    let p = &device("mlx5_0").ports[0];
    assert_eq!(best_gid(p, false).unwrap().index, 3, "IPv4-mapped, RoCE v2");
    assert_eq!(best_gid(p, true).unwrap().index, 5, "IPv6 global, RoCE v2");
    // An interface without an IP address: only the link-local pair; v2 still wins.
    let down = &device("mlx5_2").ports[0];
    assert_eq!(best_gid(down, false).unwrap().index, 1);
    // A kernel that does not publish types: the IPv4 address still wins over link-local.
    let old = &device("mlx4_0").ports[0];
    assert_eq!(old.gids.len(), 2);
    assert!(old.gids.iter().all(|g| g.kind.is_none()));
    assert_eq!(best_gid(old, false).unwrap().index, 1);
    let empty = Port {
        num: 1,
        state: "4: ACTIVE".into(),
        link_layer: LinkLayer::Ethernet,
        gids: Vec::new(),
        netdev_mtu: None,
    };
    assert_eq!(best_gid(&empty, false), None);
}

#[test]
fn unusable_ports_and_entries_are_refused_by_name() {
    let ib = &device("mlx5_1").ports[0];
    let e = check_roce_port("mlx5_1", ib, 0).unwrap_err();
    assert!(
        e.contains("InfiniBand") && e.contains("Ethernet port"),
        "{e}"
    );
    let down = &device("mlx5_2").ports[0];
    let e = check_roce_port("mlx5_2", down, 1).unwrap_err();
    assert!(e.contains("not active") && e.contains("1: DOWN"), "{e}");
    let p = &device("mlx5_0").ports[0];
    let e = check_roce_port("mlx5_0", p, 9).unwrap_err();
    assert!(
        e.contains("GID index 9") && e.contains("the best here is 3, RoCE v2"),
        "{e}"
    );
    assert_eq!(
        check_roce_port("mlx5_0", p, 0).unwrap().kind,
        Some(GidType::IbRoceV1)
    );
}

#[test]
fn no_rdma_support_is_an_empty_list_and_odd_files_are_skipped() {
    assert_eq!(
        read_devices(Path::new("/nonexistent/infiniband")).unwrap(),
        []
    );
    assert_eq!(
        parse_gid("fe80:0000:0000:0000:0a2b:3cff:fe4d:5e6f").unwrap()[15],
        0x6f
    );
    for bad in ["", "fe80", "zz::1", "1:2:3:4:5:6:7:8:9"] {
        assert_eq!(parse_gid(bad), None, "{bad:?}");
    }
    for t in [GidType::IbRoceV1, GidType::RoceV2] {
        assert_eq!(GidType::from_name(t.name()), Some(t));
        assert_eq!(GidType::from_name(t.short()), Some(t));
    }
    assert_eq!(GidType::from_name("RoCE v3"), None);
}

#[test]
fn the_interface_mtu_gives_the_roce_mtu() {
    // The fixtures' interfaces: enp65s0f0 at 9000, enp65s0f1 at 1500; none for InfiniBand.
    assert_eq!(device("mlx5_0").ports[0].netdev_mtu, Some(9000));
    assert_eq!(device("mlx5_2").ports[0].netdev_mtu, Some(1500));
    assert_eq!(device("mlx5_1").ports[0].netdev_mtu, None);
    for (netdev, roce) in [
        (9000, Some(4096)),
        (4200, Some(4096)),
        (4191, Some(2048)),
        (1500, Some(1024)),
        (1120, Some(1024)),
        (1119, Some(512)),
        (300, None),
    ] {
        assert_eq!(roce_mtu(netdev), roce, "{netdev}");
    }
}
