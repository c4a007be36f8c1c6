//! The counters line the long-running commands print on exit (one JSON object), shared by the binaries.

use turbotun::tunnel::TunnelStats;

/// The counters as one JSON line: both directions added up at the top (`drops` their total, `errors` the
/// faults among them), then each direction.
pub fn tunnel_line(mode: &str, stats: &TunnelStats) -> serde_json::Value {
    let mut total = stats.to_network;
    total.add(&stats.from_network);
    let mut line = serde_json::json!({ "mode": mode });
    if let (Some(line), Ok(serde_json::Value::Object(counters))) = (line.as_object_mut(), serde_json::to_value(total)) {
        line.extend(counters);
        line.insert("drops".into(), total.drops.total().into());
        line.insert("drops_by_reason".into(), serde_json::to_value(total.drops).unwrap_or_default());
        line.insert("errors".into(), total.drops.faults().into());
        line.insert("to_network".into(), serde_json::to_value(stats.to_network).unwrap_or_default());
        line.insert("from_network".into(), serde_json::to_value(stats.from_network).unwrap_or_default());
    }
    line
}
