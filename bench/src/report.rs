//! Renders a results file as the markdown tables of docs/benchmarks.md.

use serde_json::Value;
use std::fmt::Write;

fn us(v: &Value) -> String {
    let Some(v) = v.as_f64() else {
        return "–".into();
    };
    if v >= 10_000.0 {
        format!("{:.0} ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn ms(v: &Value) -> String {
    match v.as_f64() {
        Some(v) if v >= 100.0 => format!("{v:.0} ms"),
        Some(v) => format!("{v:.1} ms"),
        None => "–".into(),
    }
}

fn count(v: &Value) -> String {
    let Some(v) = v.as_f64() else {
        return "–".into();
    };
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0} k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn ratio(a: &Value, b: &Value) -> String {
    match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => {
            let r = a / b;
            if r >= 10.0 {
                format!("{r:.0}×")
            } else if r >= 0.1 {
                format!("{r:.2}×")
            } else {
                format!("{r:.3}×")
            }
        }
        _ => "–".into(),
    }
}

fn find<'a>(list: &'a Value, system: &str, key: &str, n: &Value) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|r| r["system"] == system && &r[key] == n)
}

fn best(run: &Value) -> &Value {
    let i = run["best"].as_u64().unwrap_or(0) as usize;
    &run["steps"][i]
}

/// The steps of both runs at the highest offered rate that both passed.
fn same_rate<'a>(p: &'a Value, s: &'a Value) -> Option<(&'a Value, &'a Value)> {
    let passed = |run: &'a Value| -> Vec<&'a Value> {
        run["steps"]
            .as_array()
            .map(|steps| steps.iter().filter(|s| s["pass"] == true).collect())
            .unwrap_or_default()
    };
    let (ps, ss) = (passed(p), passed(s));
    ss.iter()
        .filter_map(|b| ps.iter().find(|a| a["rate"] == b["rate"]).map(|a| (*a, *b)))
        .max_by_key(|(a, _)| a["rate"].as_u64().unwrap_or(0))
}

pub fn markdown(results: &Value) -> String {
    let mut out = String::new();
    let meta = &results["meta"];
    let _ = writeln!(
        out,
        "Run {} on {} ({} cores, {} GiB), {}; load average {} at start.\n",
        meta["date"].as_str().unwrap_or("?"),
        meta["cpu"].as_str().unwrap_or("?"),
        meta["cores"],
        meta["memory_gib"],
        meta["kernel"].as_str().unwrap_or("?"),
        meta["load_at_start"],
    );
    let _ = writeln!(
        out,
        "Versions: {} (commit {}), {}; Node {}, socket.io {}, socket.io-client {}.\n",
        meta["pi_host"].as_str().unwrap_or("?"),
        meta["git"].as_str().unwrap_or("?"),
        meta["rustc"].as_str().unwrap_or("?"),
        meta["node"].as_str().unwrap_or("?"),
        meta["socket_io"].as_str().unwrap_or("?"),
        meta["socket_io_client"].as_str().unwrap_or("?"),
    );

    let fanout = &results["fanout"];
    if let Some(runs) = fanout.as_array().filter(|r| !r.is_empty()) {
        let _ = writeln!(out, "### Fan-out\n");
        let _ = writeln!(
            out,
            "Highest offered rate each system kept up with (every delivery within {}s of the \
             schedule), and the first, light step.\n",
            0.25
        );
        let _ = writeln!(
            out,
            "| subscribers | system | events/s offered | delivered events/s | server CPU per delivery | clients' CPU per delivery | p50 | p99 | light load: rate, p50, p99 |"
        );
        let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---|");
        let mut ns: Vec<&Value> = Vec::new();
        for run in runs {
            if run.get("error").is_some() {
                let _ = writeln!(
                    out,
                    "| {} | {} | error: {} | | | | | | |",
                    run["subscribers"],
                    run["system"].as_str().unwrap_or("?"),
                    run["error"].as_str().unwrap_or("?")
                );
                continue;
            }
            if !ns.contains(&&run["subscribers"]) {
                ns.push(&run["subscribers"]);
            }
            let b = best(run);
            let light = &run["steps"][0];
            let passed = b["pass"] == true;
            let _ = writeln!(
                out,
                "| {} | {} | {}{} | {} | {:.2} µs | {:.2} µs | {} | {} | {}/s, {}, {} |",
                run["subscribers"],
                run["system"].as_str().unwrap_or("?"),
                count(&b["rate"]),
                if passed { "" } else { " (none kept up)" },
                count(&b["delivered_per_s"]),
                b["server_cpu_us_per_delivery"].as_f64().unwrap_or(0.0),
                b["client_cpu_us_per_delivery"].as_f64().unwrap_or(0.0),
                us(&b["latency"]["p50_us"]),
                us(&b["latency"]["p99_us"]),
                count(&light["rate"]),
                us(&light["latency"]["p50_us"]),
                us(&light["latency"]["p99_us"]),
            );
        }
        let _ = writeln!(
            out,
            "\n| subscribers | delivered/s, pi-host ÷ Socket.IO | server CPU per delivery, pi-host ÷ Socket.IO | same offered rate (Socket.IO's highest that both kept up with): p50 / p99, pi-host vs Socket.IO | light load p99, pi-host ÷ Socket.IO |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---|---:|");
        for n in ns {
            let (Some(p), Some(s)) = (
                find(fanout, "pi-host", "subscribers", n),
                find(fanout, "socket.io", "subscribers", n),
            ) else {
                continue;
            };
            let (bp, bs) = (best(p), best(s));
            let same = same_rate(p, s).map_or("–".to_string(), |(a, b)| {
                format!(
                    "{}/s: {} / {} vs {} / {}",
                    count(&a["rate"]),
                    us(&a["latency"]["p50_us"]),
                    us(&a["latency"]["p99_us"]),
                    us(&b["latency"]["p50_us"]),
                    us(&b["latency"]["p99_us"]),
                )
            });
            let _ = writeln!(
                out,
                "| {n} | {} | {} | {same} | {} |",
                ratio(&bp["delivered_per_s"], &bs["delivered_per_s"]),
                ratio(
                    &bp["server_cpu_us_per_delivery"],
                    &bs["server_cpu_us_per_delivery"]
                ),
                ratio(
                    &p["steps"][0]["latency"]["p99_us"],
                    &s["steps"][0]["latency"]["p99_us"]
                ),
            );
        }
        let _ = writeln!(
            out,
            "\nEvery step (offered events/s → delivered/s, server CPU µs per delivery, p50/p99, pass):\n"
        );
        for run in runs.iter().filter(|r| r.get("error").is_none()) {
            let steps: Vec<String> = run["steps"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .map(|s| {
                            format!(
                                "{} → {} ({:.2} µs, {}/{}){}",
                                count(&s["rate"]),
                                count(&s["delivered_per_s"]),
                                s["server_cpu_us_per_delivery"].as_f64().unwrap_or(0.0),
                                us(&s["latency"]["p50_us"]),
                                us(&s["latency"]["p99_us"]),
                                if s["pass"] == true { "" } else { " ✗" }
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "- {} × {}: {}",
                run["system"].as_str().unwrap_or("?"),
                run["subscribers"],
                steps.join("; ")
            );
        }
        let _ = writeln!(out);
    }

    let resume = &results["resume"];
    if let Some(runs) = resume.as_array().filter(|r| !r.is_empty()) {
        let _ = writeln!(out, "### Resume\n");
        let _ = writeln!(
            out,
            "| missed events | pi-host: time to caught up (median) | Socket.IO | pi-host ÷ Socket.IO | pi-host replay rate | pi-host: connect + hello, client parse, server CPU, bytes |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---|");
        let rows = |system: &str| -> Vec<Value> {
            runs.iter()
                .find(|r| r["system"] == system)
                .and_then(|r| r["rows"].as_array().cloned())
                .unwrap_or_default()
        };
        let (p, s) = (rows("pi-host"), rows("socket.io"));
        for row in &p {
            let peer = s.iter().find(|r| r["missed"] == row["missed"]);
            let peer_ms = peer.map_or(Value::Null, |r| r["median_ms"].clone());
            let rate = row["missed"].as_f64().unwrap_or(0.0)
                / (row["median_ms"].as_f64().unwrap_or(f64::INFINITY) / 1000.0);
            let last = &row["last"];
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} events/s | {}, {}, {}, {:.1} MB |",
                count(&row["missed"]),
                ms(&row["median_ms"]),
                ms(&peer_ms),
                ratio(&row["median_ms"], &peer_ms),
                count(&Value::from(rate)),
                ms(&last["hello_ms"]),
                ms(&last["client_parse_ms"]),
                ms(&last["server_cpu_ms"]),
                last["bytes"].as_f64().unwrap_or(0.0) / 1e6,
            );
        }
        for run in runs.iter().filter(|r| r.get("error").is_some()) {
            let _ = writeln!(
                out,
                "\n{}: error: {}",
                run["system"].as_str().unwrap_or("?"),
                run["error"]
            );
        }
        let _ = writeln!(out);
    }

    let memory = &results["memory"];
    if let Some(runs) = memory.as_array().filter(|r| !r.is_empty()) {
        let _ = writeln!(out, "### Memory\n");
        let _ = writeln!(
            out,
            "| idle authenticated connections | pi-host per connection | Socket.IO per connection | pi-host ÷ Socket.IO | RSS before → after (pi-host; Socket.IO) |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---|");
        let mut ns: Vec<&Value> = Vec::new();
        for r in runs {
            if r.get("error").is_none() && !ns.contains(&&r["connections"]) {
                ns.push(&r["connections"]);
            }
        }
        for n in ns {
            let p = find(memory, "pi-host", "connections", n);
            let s = find(memory, "socket.io", "connections", n);
            let kib = |r: Option<&Value>| {
                r.and_then(|r| r["bytes_per_connection"].as_f64())
                    .map_or("–".into(), |b| format!("{:.1} KiB", b / 1024.0))
            };
            let rss = |r: Option<&Value>| {
                r.map_or("–".into(), |r| {
                    format!(
                        "{} → {} MiB",
                        r["rss0_kib"].as_u64().unwrap_or(0) / 1024,
                        r["rss_kib"].as_u64().unwrap_or(0) / 1024
                    )
                })
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {}; {} |",
                count(n),
                kib(p),
                kib(s),
                ratio(
                    &p.map_or(Value::Null, |r| r["bytes_per_connection"].clone()),
                    &s.map_or(Value::Null, |r| r["bytes_per_connection"].clone())
                ),
                rss(p),
                rss(s),
            );
        }
        for r in runs.iter().filter(|r| r.get("error").is_some()) {
            let _ = writeln!(out, "\nerror: {}", r["error"]);
        }
        let _ = writeln!(out);
    }

    let d = &results["durability"];
    if d.is_object() && d.get("error").is_none() {
        let _ = writeln!(out, "### Durability\n");
        let _ = writeln!(
            out,
            "| data directory | events/s at full speed (1 subscriber) | server CPU per event | p50 / p99 at 100/s | at 1k/s | at 10k/s | fdatasync p50 / p99 |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        for label in ["disk", "tmpfs"] {
            let r = &d[label];
            let paced = |i: usize| {
                format!(
                    "{} / {}",
                    us(&r["paced"][i]["latency"]["p50_us"]),
                    us(&r["paced"][i]["latency"]["p99_us"])
                )
            };
            let _ = writeln!(
                out,
                "| {label} | {} | {:.2} µs | {} | {} | {} | {} / {} |",
                count(&r["full_speed"]["events_per_s"]),
                r["full_speed"]["server_cpu_us_per_event"]
                    .as_f64()
                    .unwrap_or(0.0),
                paced(0),
                paced(1),
                paced(2),
                us(&r["fsync"]["p50_us"]),
                us(&r["fsync"]["p99_us"]),
            );
        }
        let added: Vec<String> = (0..3)
            .map(|i| {
                let p50 = |l: &str| {
                    d[l]["paced"][i]["latency"]["p50_us"]
                        .as_f64()
                        .unwrap_or(0.0)
                };
                format!(
                    "{}/s: {}",
                    count(&d["disk"]["paced"][i]["rate"]),
                    us(&Value::from(p50("disk") - p50("tmpfs")))
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "\nAdded by durability at p50 (disk − tmpfs): {}.\n",
            added.join(", ")
        );
    } else if d.get("error").is_some() {
        let _ = writeln!(out, "### Durability\n\nerror: {}\n", d["error"]);
    }
    bytes_per_reply(&mut out, &results["bytes"]);
    gateway(&mut out, &results["gateway"]);
    out
}

fn kib(v: &Value) -> String {
    match v.as_f64() {
        Some(v) if v >= 10_240.0 => format!("{:.0} MiB", v / 1024.0),
        Some(v) => format!("{v:.1} KiB"),
        None => "–".into(),
    }
}

fn signed_us(v: &Value) -> String {
    match v.as_f64() {
        Some(v) if v < 0.0 => format!("−{}", us(&Value::from(-v))),
        Some(_) => format!("+{}", us(v)),
        None => "–".into(),
    }
}

/// CPU microseconds per second as a share of one core.
fn percent(v: &Value) -> String {
    v.as_f64()
        .map_or("–".into(), |v| format!("{:.1}%", v / 10_000.0))
}

fn load(step: &Value) -> String {
    format!(
        "{:.1}–{:.1}",
        step["load_before"].as_f64().unwrap_or(0.0),
        step["load_after"].as_f64().unwrap_or(0.0)
    )
}

/// The gateway scenario: one row per host count, then the ceiling steps.
fn gateway(out: &mut String, g: &Value) {
    if let Some(error) = g.get("error") {
        let _ = writeln!(out, "### Gateway\n\nerror: {error}\n");
        return;
    }
    let Some(steps) = g["steps"].as_array() else {
        return;
    };
    let _ = writeln!(
        out,
        "### Gateway\n\n{} subscribers per host on each path, {} events/s per host for {} s; {}.\n",
        g["per_host"],
        g["rate_per_host"],
        g["secs"],
        g["nats"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        out,
        "| hosts | connections (each path) | offered events/s | delivered/s via gateway | via gateway p50 / p99 | direct p50 / p99 | added p50 / p99 | gateway CPU per delivery (net of idle) | NATS CPU per delivery (net of idle) | hosts' CPU per direct delivery | idle CPU, gateway / NATS | gateway RSS idle → subscribed → after | per connection (subscribed / after) | load |"
    );
    let _ = writeln!(
        out,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for s in steps {
        if let Some(error) = s.get("error") {
            let _ = writeln!(out, "| {} | error: {error} |", s["hosts"]);
            continue;
        }
        let (v, d, m) = (&s["gateway"], &s["direct"], &s["memory"]);
        let complete = if v["received"] == v["expected"] && d["received"] == d["expected"] {
            String::new()
        } else {
            format!(
                " (got {} of {} via gateway, {} direct)",
                v["received"], v["expected"], d["received"]
            )
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {}{complete} | {} / {} | {} / {} | {} / {} | {} ({}) | {} ({}) | {} | {} / {} | {} → {} → {} | {} / {} | {} |",
            s["hosts"],
            s["connections"],
            count(&s["offered_events_per_s"]),
            count(&v["delivered_per_s"]),
            us(&v["latency"]["p50_us"]),
            us(&v["latency"]["p99_us"]),
            us(&d["latency"]["p50_us"]),
            us(&d["latency"]["p99_us"]),
            signed_us(&s["added_p50_us"]),
            signed_us(&s["added_p99_us"]),
            us(&v["cpu_us_per_delivery"]),
            us(&v["net_cpu_us_per_delivery"]),
            us(&v["nats_cpu_us_per_delivery"]),
            us(&v["nats_net_cpu_us_per_delivery"]),
            us(&d["hosts_cpu_us_per_delivery"]),
            percent(&v["idle_cpu_us_per_s"]),
            percent(&v["nats_idle_cpu_us_per_s"]),
            kib(&m["gateway_rss_idle_kib"]),
            kib(&m["gateway_rss_connected_kib"]),
            kib(&m["gateway_rss_after_kib"]),
            kib(&m["kib_per_connection_connected"]),
            kib(&m["kib_per_connection_after"]),
            load(s),
        );
    }
    let _ = writeln!(out);
    let Some(ramp) = g["ceiling"]["steps"].as_array() else {
        return;
    };
    let _ = writeln!(
        out,
        "Ceiling through the gateway alone ({} hosts, {} s steps):\n",
        g["ceiling"]["hosts"], g["ceiling"]["secs"]
    );
    let _ = writeln!(
        out,
        "| events/s per host | offered events/s | delivered/s | p50 | p99 | gateway CPU per delivery | NATS CPU per delivery | kept up | load |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---|---|");
    for s in ramp {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s["rate_per_host"],
            count(&s["offered_events_per_s"]),
            count(&s["delivered_per_s"]),
            us(&s["latency"]["p50_us"]),
            us(&s["latency"]["p99_us"]),
            us(&s["cpu_us_per_delivery"]),
            us(&s["nats_cpu_us_per_delivery"]),
            if s["pass"] == true { "yes" } else { "no" },
            load(s),
        );
    }
    let _ = writeln!(out);
}

/// Bytes per reply: the agent's stdout, the subscriber's event frames and the store, each
/// also per byte of the reply itself.
fn bytes_per_reply(out: &mut String, b: &Value) {
    if let Some(error) = b.get("error") {
        let _ = writeln!(out, "### Bytes per reply\n\nerror: {error}\n");
        return;
    }
    let Some(cases) = b["cases"].as_array() else {
        return;
    };
    let _ = writeln!(out, "### Bytes per reply\n");
    let _ = writeln!(
        out,
        "| reply | its bytes | agent's stdout (pi's shape) | to the subscriber | stored | events |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    let cell = |v: &Value, reply: &Value| format!("{} B ({})", count(v), ratio(v, reply));
    for c in cases {
        let reply = &c["reply_bytes"];
        let _ = writeln!(
            out,
            "| {} | {} B | {} | {} | {} | {} |",
            c["case"].as_str().unwrap_or("?"),
            count(reply),
            cell(&c["agent_stdout"], reply),
            cell(&c["wire"], reply),
            cell(&c["stored"], reply),
            count(&c["events"]),
        );
    }
    let _ = writeln!(out);
}
