//! Charts via plotters: the grouped bar chart (one panel per traffic kind, one bar per mode with a min–max
//! whisker) and the loss bench's line chart (one panel per queue length, received against offered, one line
//! per mode).

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
        "gotatun" => shade((200, 50, 60)),
        _ => shade((160, 80, 200)),
    }
}

/// One bar: median, min and max of the metric (none where the mode has no result).
type Bar = Option<(f64, f64, f64)>;

/// What the bars of a bar chart show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    /// The headline: Gbps for TCP, received kpps for UDP.
    Headline,
    /// Receiver goodput in Gbps, for every traffic kind.
    Gbps,
}

impl Metric {
    fn of(self, s: &Summary, t: &Traffic) -> Option<crate::stats::Spread> {
        match self {
            Metric::Headline => s.headline(t.udp),
            Metric::Gbps => s.gbps,
        }
    }

    fn unit(self, t: &Traffic) -> &'static str {
        match self {
            Metric::Headline if t.udp => "received kpps",
            _ => "Gbps",
        }
    }
}

/// Each mode's bar for one traffic kind, and the panel's y range.
fn panel_values(modes: &[(&str, &str)], summary: &[Summary], t: &Traffic, metric: Metric) -> (Vec<Bar>, f64) {
    let vals: Vec<Bar> = modes
        .iter()
        .map(|(m, _)| {
            summary
                .iter()
                .find(|s| s.mode == *m && s.traffic == t.label)
                .and_then(|s| metric.of(s, t))
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

/// Write the chart of the headline metric to `path` (.svg or .png).
pub(crate) fn write_chart(path: &Path, summary: &[Summary], traffic: &[Traffic], title: &str) -> Result<()> {
    write_bar_chart(path, summary, traffic, title, Metric::Headline)
}

/// Write a grouped bar chart of `metric` to `path` (.svg or .png): one panel per traffic kind, one bar per mode
/// with a min–max whisker.
pub(crate) fn write_bar_chart(
    path: &Path,
    summary: &[Summary],
    traffic: &[Traffic],
    title: &str,
    metric: Metric,
) -> Result<()> {
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
    // Room for each bar's label (about 7 px a character at 12 px) so that long ones do not run together.
    let longest = modes.iter().map(|(m, _)| m.chars().count() as u32).max().unwrap_or(0);
    let panel_w = ((7 * longest + 10).max(110) * modes.len() as u32 + 120).max(640);
    let panel_h = 360u32;
    let size = (panel_w, panel_h * traffic.len() as u32 + 40);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw(&root, &modes, summary, traffic, title, metric)?;
            root.present().map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        }
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw(&root, &modes, summary, traffic, title, metric)?;
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
    metric: Metric,
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
        let (vals, ymax) = panel_values(modes, summary, t, metric);
        let unit = metric.unit(t);
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

/// One line of a [`LinePanel`]: a mode's points (x, y), coloured by its family.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub label: String,
    pub family: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a line chart, with the line y = x drawn dashed as the ideal (everything offered received).
#[derive(Debug, Clone)]
pub(crate) struct LinePanel {
    pub caption: String,
    pub x_desc: String,
    pub y_desc: String,
    pub lines: Vec<Line>,
}

/// Write a line chart to `path` (.svg or .png): the panels stacked, a legend in each.
pub(crate) fn write_line_chart(path: &Path, panels: &[LinePanel], title: &str) -> Result<()> {
    register_font()?;
    if panels.is_empty() || panels.iter().all(|p| p.lines.is_empty()) {
        bail!("nothing to chart");
    }
    let size = (900u32, 480 * panels.len() as u32 + 40);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_lines(&root, panels, title)?;
            root.present().map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        }
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_lines(&root, panels, title)?;
            root.present().map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        }
        _ => bail!("--chart: unknown extension {:?} (use .svg or .png)", path.display().to_string()),
    }
    Ok(())
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, panels: &[LinePanel], title: &str) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("chart: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    for (area, p) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let modes: Vec<(&str, &str)> = p.lines.iter().map(|l| (l.label.as_str(), l.family.as_str())).collect();
        let colors = mode_colors(&modes);
        let max = p.lines.iter().flat_map(|l| &l.points).map(|&(x, y)| x.max(y)).fold(0.0f64, f64::max).max(1e-3);
        let (xmax, ymax) = (max * 1.05, max * 1.1);
        let mut chart = ChartBuilder::on(area)
            .caption(&p.caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(e)?;
        chart.configure_mesh().x_desc(&p.x_desc).y_desc(&p.y_desc).draw().map_err(e)?;
        // The ideal: everything offered arrives.
        chart
            .draw_series(DashedLineSeries::new(vec![(0.0, 0.0), (xmax, xmax)], 6, 4, BLACK.mix(0.4).stroke_width(1)))
            .map_err(e)?
            .label("received = offered")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
        for (line, &c) in p.lines.iter().zip(&colors) {
            chart
                .draw_series(LineSeries::new(line.points.iter().copied(), c.stroke_width(2)).point_size(3))
                .map_err(e)?
                .label(line.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(e)?;
    }
    Ok(())
}

/// Check the chart path (and the font it needs) before spending minutes measuring.
pub(crate) fn check_path(path: &Path) -> Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "svg" | "png" => register_font().context("--chart"),
        _ => bail!("--chart {}: the file name must end in .svg or .png", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iperf::traffic_by_label;
    use crate::stats::Spread;

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
    fn line_chart_has_every_line_and_its_legend() {
        let panels = vec![LinePanel {
            caption: "received vs offered".into(),
            x_desc: "offered kpps".into(),
            y_desc: "received kpps".into(),
            lines: vec![
                Line {
                    label: "turbotun-offload".into(),
                    family: "turbotun".into(),
                    points: vec![(50.0, 50.0), (150.0, 120.0)],
                },
                Line {
                    label: "tunrs-offload".into(),
                    family: "tunrs".into(),
                    points: vec![(50.0, 49.0), (150.0, 90.0)],
                },
            ],
        }];
        let path = std::env::temp_dir().join(format!("turbotun-line-test-{}.svg", std::process::id()));
        let written = write_line_chart(&path, &panels, "loss");
        if register_font().is_err() {
            assert!(written.is_err());
            return;
        }
        written.unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for label in ["turbotun-offload", "tunrs-offload", "received = offered", "offered kpps", "loss"] {
            assert!(svg.contains(label), "no {label:?} in the chart");
        }
        assert!(write_line_chart(&path, &[], "x").is_err());
    }

    #[test]
    fn chart_paths() {
        assert!(check_path(Path::new("/tmp/c.jpg")).is_err());
        assert_eq!(check_path(Path::new("/tmp/c.svg")).is_ok(), register_font().is_ok());
    }
}
