//! Results as perftest prints them: the table's header and lines, and latency samples.

use super::*;

/// One line of results.
#[derive(Debug, Clone)]
pub enum Report {
    /// A bandwidth phase.
    Bw(BwResult),
    /// A latency phase.
    Lat(LatResult),
}

impl Report {
    /// The JSON object with the documented keys.
    pub fn to_json(&self, test: Test) -> serde_json::Value {
        let mut v = self.to_json_fields(test);
        if let Some(why) = self.why() {
            v["verify_error"] = json!(why);
        }
        v
    }

    fn to_json_fields(&self, test: Test) -> serde_json::Value {
        match self {
            Report::Bw(r) => json!({
                "test": test.name(),
                "bytes": r.size,
                "iterations": r.iterations,
                "total_bytes": r.total_bytes,
                "bw_peak_gbps": r.bw_peak_gbps,
                "bw_avg_gbps": r.bw_avg_gbps,
                "msg_rate_mpps": r.msg_rate_mpps,
                "verified": r.verified,
                "seconds": r.seconds,
                "retransmits": r.retransmits,
                "rnr_retries": r.rnr_retries,
                "ecn_marks_echoed": r.ecn_marks_echoed,
                "cwnd_cuts": r.cwnd_cuts,
                "cnps_received": r.cnps_received,
                "paths_used": r.paths_used,
                "path_failures": r.path_failures,
                "lost_by_sack": r.lost_by_sack,
                "lost_by_timeout": r.lost_by_timeout,
                "peer_silent_waits": r.peer_silent_waits,
                "requests_waited": r.requests_waited,
                "connections": r.connections.iter().map(|c| json!({
                    "rate_mbps": c.rate_mbps,
                    "connection_window": c.connection_window,
                    "hint_received_mbps": c.hint_received_mbps,
                    "path_windows": c.path_windows,
                })).collect::<Vec<_>>(),
            }),
            Report::Lat(r) => {
                let mut v = json!({
                "test": test.name(),
                "bytes": r.size,
                "iterations": r.iterations,
                "t_min_us": r.t_min_us,
                "t_avg_us": r.t_avg_us,
                "p50_us": r.p50_us,
                "p99_us": r.p99_us,
                "p999_us": r.p999_us,
                "t_max_us": r.t_max_us,
                "t_stdev_us": r.t_stdev_us,
                "verified": r.verified,
                });
                if !r.samples_us.is_empty() {
                    v["samples_us"] = json!(r.samples_us);
                }
                v
            }
        }
    }

    /// What the first failed check found, when one failed.
    pub fn why(&self) -> Option<&str> {
        match self {
            Report::Bw(r) => r.why.as_deref(),
            Report::Lat(r) => r.why.as_deref(),
        }
    }

    /// Whether every byte checked out.
    pub fn verified(&self) -> bool {
        match self {
            Report::Bw(r) => r.verified,
            Report::Lat(r) => r.verified,
        }
    }
}

pub(super) const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's table header.
pub fn table_header(test: Test, gbits: bool) -> String {
    if test.is_latency() {
        format!(
            "{RULE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        )
    } else {
        let unit = if gbits { "Gb/sec" } else { "MB/sec" };
        format!(
            "{RULE}\n #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
        )
    }
}

/// perftest's table line.
pub fn table_line(r: &Report, gbits: bool) -> String {
    match r {
        Report::Bw(b) => {
            let conv = |gbps: f64| if gbits { gbps } else { gbps * 1e9 / 8.0 / 1048576.0 };
            format!(
                " {:<10} {:<10}       {:.2}            {:.2}\t\t   {:.6}",
                b.size,
                b.iterations,
                conv(b.bw_peak_gbps),
                conv(b.bw_avg_gbps),
                b.msg_rate_mpps
            )
        }
        Report::Lat(l) => format!(
            " {:<7} {:<10}   {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}         {:<7.2}                {:<7.2}",
            l.size,
            l.iterations,
            l.t_min_us,
            l.t_max_us,
            l.p50_us,
            l.t_avg_us,
            l.t_stdev_us,
            l.p99_us,
            l.p999_us
        ),
    }
}

/// A sample as perftest's `-H` prints it (`%g`: six significant digits, no trailing zeros).
pub fn sample_text(us: f64) -> String {
    if !us.is_finite() || us == 0.0 {
        return format!("{us}");
    }
    let digits = (5 - us.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{us:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
