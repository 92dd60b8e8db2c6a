//! `GET /`: a small status page, rendered on the server (no build step, no
//! external assets). Every target and probe with its state, last message,
//! age and a sparkline of recent results (bar height: duration; colour:
//! status). A few lines of inline script follow `/v1/watch?all=1` to keep
//! it live: each outcome updates its row and extends its sparkline.
//! `/?updates=N` stops following after N outcomes, so a snapshot tool
//! (headless Chromium's `--virtual-time-budget`, which waits for the
//! network to go quiet) sees a page that has been live and then settles.

use super::ApiState;
use sonde_core::results::{HistoryEntry, ProbeView};
use sonde_sandbox::verdict::Status;
use std::fmt::Write;
use std::time::SystemTime;

/// Escapes text for HTML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn age(at: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(at).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

const SPARK_W: usize = 4;
const SPARK_H: f64 = 20.0;

/// Bar height for a duration: logarithmic from 0.1 ms to 10 s.
fn bar_height(ms: f64) -> f64 {
    let x = (ms.max(0.1).log10() + 1.0) / 5.0;
    (x.clamp(0.05, 1.0) * SPARK_H).round()
}

fn sparkline(history: &[HistoryEntry]) -> String {
    let mut svg = format!(
        r#"<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}">"#,
        32 * SPARK_W,
        SPARK_H,
        32 * SPARK_W,
        SPARK_H
    );
    for (i, h) in history.iter().rev().take(32).rev().enumerate() {
        let height = bar_height(h.duration_ms);
        let _ = write!(
            svg,
            r#"<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{} {:.1} ms</title></rect>"#,
            h.status.as_str(),
            i * SPARK_W,
            SPARK_H - height,
            SPARK_W - 1,
            height,
            h.status.as_str(),
            h.duration_ms
        );
    }
    svg.push_str("</svg>");
    svg
}

fn badge(state: Status) -> String {
    format!(r#"<span class="badge {0}">{0}</span>"#, state.as_str())
}

fn flag(name: &str, on: bool) -> String {
    let class = if on { "success" } else { "failure" };
    let text = if on { name.to_string() } else { format!("not {name}") };
    format!(r#"<span class="badge {class}">{text}</span>"#)
}

fn probe_row(p: &ProbeView, now: SystemTime) -> String {
    let (message, at, ms) = match &p.last {
        Some(o) => (
            o.result.message.as_str(),
            Some(o.at),
            format!("{:.1} ms", o.result.duration.as_secs_f64() * 1000.0),
        ),
        None => ("not run yet", None, String::new()),
    };
    let (age_text, at_attr) = match at {
        Some(at) => (age(at, now), humantime::format_rfc3339_millis(at).to_string()),
        None => ("—".to_string(), String::new()),
    };
    let stale = if p.stale {
        r#" <span class="stale">stale</span>"#
    } else {
        ""
    };
    format!(
        r#"<tr data-probe="{name}"><td class="state">{badge}{stale}</td><td class="name">{name}</td><td>{target}</td><td>{kind}</td><td>{groups}</td><td class="message">{message}</td><td><time datetime="{at_attr}">{age_text}</time></td><td class="ms">{ms}</td><td>{spark}</td></tr>"#,
        name = esc(&p.name),
        badge = badge(p.state),
        target = esc(&p.target),
        kind = p.kind.as_str(),
        groups = esc(&p.groups.join(", ")),
        message = esc(message),
        spark = sparkline(p.history.as_deref().unwrap_or_default()),
    )
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
.meta{color:#666}.error{background:#fdd;border:1px solid #c33;padding:.5em;margin:.5em 0}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #eee;vertical-align:middle}
th{font-weight:600;color:#555;background:#f3f3f3}
.badge{display:inline-block;border-radius:3px;padding:0 .45em;font-size:.85em;color:#fff;margin-right:.3em}
.badge.success{background:#2a7d2e}.badge.warning{background:#c78a00}.badge.failure{background:#c0392b}.badge.unknown{background:#777}
.stale{font-size:.8em;color:#888}.message{max-width:36em;overflow-wrap:anywhere}.ms{color:#666;white-space:nowrap}
.spark rect.success{fill:#2a7d2e}.spark rect.warning{fill:#c78a00}.spark rect.failure{fill:#c0392b}.spark rect.unknown{fill:#999}
#live{font-size:.85em;color:#888}body[data-live=connected] #live{color:#2a7d2e}
"#;

const SCRIPT: &str = r#"
(function(){
  const W=4,H=20;
  function height(ms){const x=(Math.log10(Math.max(ms,0.1))+1)/5;return Math.round(Math.min(Math.max(x,0.05),1)*H);}
  function age(iso){if(!iso)return "—";const s=Math.max(0,Math.floor((Date.now()-Date.parse(iso))/1000));
    return s<60?s+"s ago":s<3600?Math.floor(s/60)+"m ago":s<86400?Math.floor(s/3600)+"h ago":Math.floor(s/86400)+"d ago";}
  function tick(){document.querySelectorAll("time[datetime]").forEach(t=>{if(t.dateTime)t.textContent=age(t.dateTime);});}
  setInterval(tick,1000);
  let updates=0;
  const max=parseInt(document.body.dataset.maxUpdates||"0",10);
  const es=new EventSource("/v1/watch?all=1");
  es.onopen=()=>{document.body.dataset.live="connected";document.getElementById("live").textContent="live";};
  es.onerror=()=>{document.body.dataset.live="reconnecting";document.getElementById("live").textContent="reconnecting…";};
  es.addEventListener("reset",()=>location.reload());
  es.addEventListener("run",ev=>{
    const r=JSON.parse(ev.data);
    const row=document.querySelector('tr[data-probe="'+CSS.escape(r.probe)+'"]');
    if(!row){location.reload();return;}
    const badge=row.querySelector(".state .badge");
    badge.className="badge "+r.state;badge.textContent=r.state;
    const stale=row.querySelector(".stale");if(stale)stale.remove();
    row.querySelector(".message").textContent=r.message;
    const t=row.querySelector("time");t.dateTime=r.at;t.textContent=age(r.at);
    row.querySelector(".ms").textContent=r.duration_ms.toFixed(1)+" ms";
    const svg=row.querySelector("svg.spark");
    const bars=svg.querySelectorAll("rect");
    if(bars.length>=32)bars[0].remove();
    svg.querySelectorAll("rect").forEach((b,i)=>b.setAttribute("x",i*W));
    const rect=document.createElementNS("http://www.w3.org/2000/svg","rect");
    const h=height(r.duration_ms);
    rect.setAttribute("class",r.status);rect.setAttribute("x",svg.querySelectorAll("rect").length*W);
    rect.setAttribute("y",H-h);rect.setAttribute("width",W-1);rect.setAttribute("height",h);
    svg.appendChild(rect);
    updates++;document.body.dataset.updates=updates;
    if(max>0&&updates>=max){es.close();document.body.dataset.live="paused";document.getElementById("live").textContent="paused";}
  });
})();
"#;

/// The page.
pub(super) fn render(state: &ApiState, max_updates: Option<u32>) -> String {
    let now = SystemTime::now();
    let status = state.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let probes = state.results.list_with_history();
    let targets = state.results.targets();
    let mut html = String::with_capacity(4096 + probes.len() * 1024);
    let _ = write!(
        html,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>sonde</title><style>{STYLE}</style></head><body data-live="connecting"{}><h1>sonde <span id="live">connecting…</span></h1><div class="meta">{} probes from {} · loaded {} · version {}</div>"#,
        max_updates.map_or(String::new(), |n| format!(r#" data-max-updates="{n}""#)),
        probes.len(),
        esc(&status.config),
        status.loaded_at.map_or("—".into(), |t| age(t, now)),
        esc(status.version),
    );
    if let Some(e) = &status.reload_error {
        let _ = write!(
            html,
            r#"<div class="error">The last reload was refused; the previous config keeps running:<br>{}</div>"#,
            esc(e)
        );
    }
    html.push_str(r#"<h2>Targets</h2><table id="targets"><tr><th>target</th><th>state</th><th>probes</th></tr>"#);
    for t in &targets {
        let _ = write!(
            html,
            r#"<tr data-target="{0}"><td>{0}</td><td>{1}{2}{3}</td><td>{4}</td></tr>"#,
            esc(&t.name),
            flag("started", t.started),
            flag("ready", t.ready),
            flag("live", t.live),
            t.probes.len()
        );
    }
    html.push_str(
        r#"</table><h2>Probes</h2><table id="probes"><tr><th>state</th><th>probe</th><th>target</th><th>kind</th><th>groups</th><th>last message</th><th>last run</th><th>took</th><th>recent runs</th></tr>"#,
    );
    for p in &probes {
        html.push_str(&probe_row(p, now));
    }
    let _ = write!(html, "</table><script>{SCRIPT}</script></body></html>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<b a="1">'&'</b>"#),
            "&lt;b a=&quot;1&quot;&gt;&#39;&amp;&#39;&lt;/b&gt;"
        );
    }

    #[test]
    fn bars_grow_with_duration_within_the_box() {
        assert!(bar_height(0.01) >= 1.0);
        assert!(bar_height(1.0) < bar_height(100.0));
        assert_eq!(bar_height(1e9), SPARK_H);
    }
}
