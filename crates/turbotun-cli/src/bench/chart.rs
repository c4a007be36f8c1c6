//! Grouped bar chart (one panel per traffic kind, one bar per mode with a min–max whisker) via plotters.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::iperf::Traffic;
use super::report::Summary;

/// TrueType fonts tried for labels (plotters' ab_glyph backend needs one registered, for SVG and PNG alike).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
];

fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let env = std::env::var("TURBOTUN_CHART_FONT").ok();
        let candidates = env.iter().map(String::as_str).chain(FONT_PATHS.iter().copied());
        for p in candidates {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("no TrueType font found for chart labels: `apt-get install fonts-dejavu-core` (or set \
             TURBOTUN_CHART_FONT=/path/to/font.ttf)"
            .to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Colour of a mode's bars by family, varying the shade within a family.
fn color(family: &str, index_in_family: usize) -> RGBColor {
    let shade = |c: (u8, u8, u8)| {
        let k = 1.0 - 0.18 * (index_in_family % 4) as f64;
        RGBColor((c.0 as f64 * k) as u8, (c.1 as f64 * k) as u8, (c.2 as f64 * k) as u8)
    };
    match family {
        "baseline" => shade((150, 150, 150)),
        "turbotun" => shade((31, 119, 240)),
        "tunrs" => shade((240, 130, 20)),
        "wggo" => shade((40, 170, 80)),
        _ => shade((160, 80, 200)),
    }
}

/// One bar: median, min and max of the headline metric (none where the mode has no result).
type Bar = Option<(f64, f64, f64)>;

/// Each mode's bar for one traffic kind, and the panel's y range.
fn panel_values(modes: &[(&str, &str)], summary: &[Summary], t: &Traffic) -> (Vec<Bar>, f64) {
    let vals: Vec<Bar> = modes
        .iter()
        .map(|(m, _)| {
            summary
                .iter()
                .find(|s| s.mode == *m && s.traffic == t.label)
                .and_then(|s| s.headline(t.udp))
                .map(|s| (s.median, s.min, s.max))
        })
        .collect();
    let ymax = vals.iter().flatten().map(|v| v.2).fold(0.0f64, f64::max).max(1e-3) * 1.15;
    (vals, ymax)
}

/// Each mode's bar colour: its family's hue, a shade per mode within the family.
fn mode_colors(modes: &[(&str, &str)]) -> Vec<RGBColor> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    modes
        .iter()
        .map(|(_, family)| match seen.iter_mut().find(|(f, _)| f == family) {
            Some((_, n)) => {
                *n += 1;
                color(family, *n)
            }
            None => {
                seen.push((family, 0));
                color(family, 0)
            }
        })
        .collect()
}

/// Write the chart to `path` (.svg or .png).
pub fn write_chart(path: &Path, summary: &[Summary], traffic: &[Traffic], title: &str) -> Result<()> {
    // plotters lays text out with a TrueType font, for SVG as for PNG.
    register_font()?;
    let mut modes: Vec<(&str, &str)> = Vec::new();
    for s in summary {
        if !modes.iter().any(|(m, _)| *m == s.mode) {
            modes.push((s.mode.as_str(), s.family.as_str()));
        }
    }
    if modes.is_empty() || traffic.is_empty() {
        bail!("nothing to chart");
    }
    let panel_w = (110 * modes.len() as u32 + 120).max(640);
    let panel_h = 360u32;
    let size = (panel_w, panel_h * traffic.len() as u32 + 40);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw(&root, &modes, summary, traffic, title)?;
            root.present().map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        }
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw(&root, &modes, summary, traffic, title)?;
            root.present().map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        }
        _ => bail!("--chart: unknown extension {:?} (use .svg or .png)", path.display().to_string()),
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    modes: &[(&str, &str)],
    summary: &[Summary],
    traffic: &[Traffic],
    title: &str,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("chart: {e:?}");
    let colors = mode_colors(modes);
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    let panels = root.split_evenly((traffic.len(), 1));
    for (panel, t) in panels.iter().zip(traffic) {
        let (vals, ymax) = panel_values(modes, summary, t);
        let unit = if t.udp { "received kpps" } else { "Gbps" };
        let n = modes.len();
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{} — {} (median, min–max)", t.label, t.description), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d((0..n.saturating_sub(1)).into_segmented(), 0.0..ymax)
            .map_err(e)?;
        let labels: Vec<String> = modes.iter().map(|(m, _)| m.to_string()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_label_style(("sans-serif", 12))
            .y_desc(unit)
            .draw()
            .map_err(e)?;
        for (i, ((_, _), v)) in modes.iter().zip(&vals).enumerate() {
            let Some((median, min, max)) = *v else {
                continue;
            };
            let c = colors[i];
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), median)], c.filled());
            bar.set_margin(0, 0, 10, 10);
            chart.draw_series(std::iter::once(bar)).map_err(e)?;
            // Whisker for min–max.
            let x = || SegmentValue::CenterOf(i);
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(x(), min), (x(), max)], BLACK.stroke_width(2))))
                .map_err(e)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    super::stats::fmt_num(median),
                    (x(), median + ymax * 0.01),
                    TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))
                .map_err(e)?;
        }
    }
    Ok(())
}

/// Check the chart path (and the font it needs) before spending minutes measuring.
pub fn check_path(path: &Path) -> Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "svg" | "png" => register_font().context("--chart"),
        _ => bail!("--chart {}: the file name must end in .svg or .png", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::iperf::traffic_by_label;
    use crate::bench::stats::Spread;

    #[test]
    fn svg_has_bars_and_labels() {
        let traffic = vec![traffic_by_label("tcp").unwrap()];
        let summary = vec![
            Summary {
                mode: "veth".into(),
                family: "baseline".into(),
                traffic: "tcp".into(),
                gbps: Spread::of([20.0, 22.0, 30.0]),
                ..Default::default()
            },
            // A mode without a result: a label and no bar.
            Summary { mode: "x<y".into(), family: "turbotun".into(), traffic: "tcp".into(), ..Default::default() },
        ];
        let path = std::env::temp_dir().join(format!("turbotun-chart-test-{}.svg", std::process::id()));
        let written = write_chart(&path, &summary, &traffic, "t & t");
        if let Err(e) = register_font() {
            // No font on this machine: the chart must say which package to install.
            let err = written.unwrap_err();
            assert!(format!("{err:#}").contains("fonts-dejavu-core"), "{err:#} ({e})");
            return;
        }
        written.unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split("</text>").next()?.trim()))
            .collect();
        for label in ["t &amp; t", "veth", "x&lt;y", "Gbps"] {
            assert!(texts.contains(&label), "no {label:?} in {texts:?}");
        }
        assert!(texts.contains(&"22.0"), "the median is printed on its bar: {texts:?}");
    }

    #[test]
    fn chart_paths() {
        assert!(check_path(Path::new("/tmp/c.jpg")).is_err());
        assert_eq!(check_path(Path::new("/tmp/c.svg")).is_ok(), register_font().is_ok());
    }
}
