//! Compiles the tests that need a real RDMA device only when `METAROCE_VERBS_DEVICE` names one.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(metaroce_verbs_device)");
    println!("cargo::rerun-if-env-changed=METAROCE_VERBS_DEVICE");
    if std::env::var_os("METAROCE_VERBS_DEVICE").is_some() {
        println!("cargo::rustc-cfg=metaroce_verbs_device");
    }
}
