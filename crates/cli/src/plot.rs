//! The plots of `ftrec compare`, drawn with `plotters` as PNG and SVG.
//!
//! Text is rendered with DejaVu Sans compiled into the binary (the `dejavu` crate) through
//! plotters' `ab_glyph` backend: no system font is looked up, so the plots look the same on any
//! machine. PNGs are encoded with the `png` crate from plotters' RGB buffer.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::compare::{CompareReport, LostTime, SummaryRow};

/// One plot written to the output directory.
#[derive(Debug, Clone)]
pub struct Plot {
    pub title: String,
    pub caption: String,
    pub png: String,
    pub svg: String,
}

const FONT: &str = "sans-serif";

fn register_fonts() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        for (style, bytes) in [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
            (FontStyle::Italic, dejavu::sans::oblique()),
            (FontStyle::Oblique, dejavu::sans::oblique()),
        ] {
            if plotters::style::register_font(FONT, style, bytes).is_err() {
                result = Err(anyhow::anyhow!("the embedded DejaVu font does not load"));
            }
        }
    });
    result
}

/// A colour per strategy, fixed by its place in the list of strategies so every plot agrees.
fn color(strategy: &str) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(90, 90, 90),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    let names = ftrec_cluster::StrategyChoice::all_names();
    let i = names
        .iter()
        .position(|n| *n == strategy)
        .unwrap_or_else(|| names.len() + strategy.bytes().map(|b| b as usize).sum::<usize>() % 3);
    PALETTE[i % PALETTE.len()]
}

/// Colours of the parts of the time lost to a failure.
const PARTS: [(&str, RGBColor); 5] = [
    ("detect", RGBColor(120, 120, 120)),
    ("replace", RGBColor(31, 119, 180)),
    ("reload", RGBColor(255, 127, 14)),
    ("redo", RGBColor(214, 39, 40)),
    ("degraded", RGBColor(148, 103, 189)),
];

fn parts(l: &LostTime) -> [f64; 5] {
    [l.detect, l.replace, l.reload, l.redo, l.degraded]
}

fn write_png(path: &Path, buf: &[u8], w: u32, h: u32) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    wr.write_image_data(buf)
        .with_context(|| format!("writing {}", path.display()))?;
    wr.finish()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

type Res = Result<()>;

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing: {e}")
}

/// Draw with `$f(root, $data)` into `$out/$stem.png` and `.svg`.
macro_rules! both {
    ($out:expr, $stem:expr, ($w:expr, $h:expr), $f:ident, $data:expr) => {{
        let (w, h): (u32, u32) = ($w, $h);
        let mut buf = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            $f(&root, $data)?;
            root.present().map_err(err)?;
        }
        write_png(&$out.join(format!("{}.png", $stem)), &buf, w, h)?;
        let svg = $out.join(format!("{}.svg", $stem));
        {
            let root = SVGBackend::new(&svg, (w, h)).into_drawing_area();
            $f(&root, $data)?;
            root.present().map_err(err)?;
        }
    }};
}

/// Every plot of the report, written to `out`.
pub fn draw_all(rep: &CompareReport, out: &Path) -> Result<Vec<Plot>> {
    register_fonts()?;
    let mut plots = Vec::new();
    let mut add = |stem: &str, title: &str, caption: String| {
        plots.push(Plot {
            title: title.into(),
            caption,
            png: format!("{stem}.png"),
            svg: format!("{stem}.svg"),
        })
    };
    let panels = rep.summary.len().div_ceil(2).max(1) as u32;
    both!(
        out,
        "throughput",
        (1200, 90 + 200 * panels),
        throughput,
        rep
    );
    let window_ms = rep
        .summary
        .iter()
        .find_map(|s| s.throughput.as_ref())
        .map_or(0.0, |t| t.window_s * 1e3);
    add(
        "throughput",
        "Training throughput over time",
        format!(
            "Samples per second of each strategy's representative run from the start of its \
             training, the mean over a sliding window of {window_ms:.0} ms (ten steps of the \
             reference), one panel per strategy over the reference in grey; redone steps count \
             as work. Red dashed: a server SIGKILLed; green dotted: the state whole again (lost \
             steps redone, or the rebuild finished). The dips between them are detection, \
             replacement and reload, or a degraded rebuild. The same points and marks are in \
             report.json (summary[].throughput)."
        ),
    );
    both!(out, "lost_per_failure", (1200, 560), lost_per_failure, rep);
    add(
        "lost_per_failure",
        "Time lost per failure",
        "Each bar is one failure of one run, split into detection, bringing up the \
         replacement, reloading state, redoing the steps since the restored state, and the \
         throughput lost while training ran degraded (window x (1 - throughput share))."
            .into(),
    );
    both!(out, "overhead", (1100, 560), overhead, rep);
    add(
        "overhead",
        "Training-time overhead against none",
        "Training time over the failure-free run without fault tolerance, minus one, split into \
         save pauses, time lost to failures and the rest (slower steps; negative when a run \
         was faster than the reference: the noise of a shared machine)."
            .into(),
    );
    both!(out, "memory_storage", (1200, 520), memory_storage, rep);
    add(
        "memory_storage",
        "Extra memory and bytes stored",
        "Left: peak resident memory of all server processes (sampled every 100 ms) beyond the \
         reference run's. Right: bytes each strategy wrote and bytes left in its store at the \
         end."
            .into(),
    );
    both!(out, "quality", (1200, 500), quality, rep);
    add(
        "quality",
        "Model quality against the failure-free run",
        "AUC and logloss on the same held-out samples; the dashed line is the failure-free \
         reference. '= digest' marks a final model identical to the reference bit for bit."
            .into(),
    );
    Ok(plots)
}

fn style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().into()
}

fn title_style() -> TextStyle<'static> {
    (FONT, 24).into_font().style(FontStyle::Bold).into()
}

fn no_data<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, what: &str) -> Res {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        what.to_string(),
        (w as i32 / 2 - 200, h as i32 / 2),
        style(18),
    ))
    .map_err(err)
}

fn throughput<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rep: &CompareReport) -> Res {
    use crate::timeline::MarkKind;
    root.fill(&WHITE).map_err(err)?;
    let rows: Vec<(&SummaryRow, &crate::timeline::Smoothed)> = rep
        .summary
        .iter()
        .filter_map(|s| s.throughput.as_ref().map(|t| (s, t)))
        .filter(|(_, t)| !t.points.is_empty())
        .collect();
    let Some(window) = rows.first().map(|r| r.1.window_s) else {
        return no_data(root, "no run with a step timeline");
    };
    let reference = rows.iter().find(|r| r.0.strategy == "none").map(|r| r.1);
    let t_end = rows
        .iter()
        .flat_map(|r| r.1.points.iter().map(|p| p.0 + window / 2.0))
        .fold(1e-3f64, f64::max);
    let y_max = rows
        .iter()
        .flat_map(|r| r.1.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.15;
    let title = format!(
        "Training throughput: samples/s, mean over a sliding {:.0} ms window",
        window * 1e3
    );
    let area = root.titled(&title, title_style()).map_err(err)?;
    // One panel per strategy, each over the reference in grey: eight lines on one chart hide
    // every failure.
    let (legend, panels) = area.split_vertically(30);
    legend
        .draw(&Text::new(
            "grey: none (reference)   red dashed: a server SIGKILLed   green dotted: \
             state whole again (redone / rebuilt)"
                .to_string(),
            (80, 6),
            style(16),
        ))
        .map_err(err)?;
    let cols = 2usize;
    let nrows = rows.len().div_ceil(cols);
    let cells = panels.split_evenly((nrows, cols));
    for ((s, t), cell) in rows.iter().zip(cells.iter()) {
        let mut chart = ChartBuilder::on(cell)
            .caption(s.strategy.as_str(), style(17))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..t_end, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("s since training started")
            .label_style(style(12))
            .axis_desc_style(style(12))
            .light_line_style(RGBColor(240, 240, 240))
            .y_labels(4)
            .x_labels(8)
            .y_label_formatter(&|v| format!("{:.0}", v))
            .draw()
            .map_err(err)?;
        if let Some(r) = reference.filter(|_| s.strategy != "none") {
            chart
                .draw_series(LineSeries::new(
                    r.points.iter().copied(),
                    RGBColor(170, 170, 170).stroke_width(2),
                ))
                .map_err(err)?;
        }
        chart
            .draw_series(LineSeries::new(
                t.points.iter().copied(),
                color(&s.strategy).stroke_width(2),
            ))
            .map_err(err)?;
        for m in &t.marks {
            let (c, dash) = match m.kind {
                MarkKind::Kill => (RGBColor(214, 39, 40), (8, 4)),
                MarkKind::Recovered => (RGBColor(44, 160, 44), (2, 4)),
            };
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(m.t_s, 0.0), (m.t_s, y_max)],
                    dash.0,
                    dash.1,
                    c.stroke_width(2),
                ))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn lost_per_failure<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rep: &CompareReport) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let bars: Vec<(String, &str, &LostTime)> = rep
        .summary
        .iter()
        .flat_map(|s| {
            s.failures.iter().enumerate().map(move |(i, l)| {
                (
                    format!("{} #{} (step {})", s.strategy, i + 1, l.at_step),
                    s.strategy.as_str(),
                    l,
                )
            })
        })
        .collect();
    if bars.is_empty() {
        let area = root
            .titled("Time lost per failure", title_style())
            .map_err(err)?;
        return no_data(&area, "no failures in this comparison");
    }
    let y_max = bars
        .iter()
        .map(|b| parts(b.2).iter().sum::<f64>())
        .fold(1e-3, f64::max)
        * 1.2;
    let n = bars.len();
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption("Time lost per failure, by phase", title_style())
        .margin(14)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.6..(n as f64 - 0.4), 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("seconds")
        .label_style(style(14))
        .axis_desc_style(style(17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (pi, (part, c)) in PARTS.iter().enumerate() {
        let c = *c;
        let rects: Vec<Rectangle<(f64, f64)>> = bars
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let p = parts(b.2);
                let lo: f64 = p[..pi].iter().sum();
                let hi = lo + p[pi];
                Rectangle::new([(i as f64 - 0.32, lo), (i as f64 + 0.32, hi)], c.filled())
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*part)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
    }
    for (i, b) in bars.iter().enumerate() {
        let total: f64 = parts(b.2).iter().sum();
        let c = color(b.1);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(i as f64 - 0.32, 0.0), (i as f64 + 0.32, total)],
                c.stroke_width(3),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{total:.2} s"),
                (i as f64 - 0.2, total + y_max * 0.05),
                style(15),
            )))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(style(15))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// A strategy's overhead split into saves, failures and the rest (fractions of the reference's
/// training time).
fn overhead_parts(s: &SummaryRow, ref_train_s: f64) -> Option<[f64; 3]> {
    let total = s.overhead?;
    let saves = s.save_pause_s / ref_train_s;
    let fails = s.failures.iter().map(LostTime::total).sum::<f64>() / ref_train_s;
    Some([saves, fails, total - saves - fails])
}

fn overhead<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rep: &CompareReport) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let Some(reference) = rep.reference() else {
        return no_data(root, "no reference run");
    };
    let rows: Vec<(&SummaryRow, [f64; 3])> = rep
        .summary
        .iter()
        .filter(|s| s.strategy != "none")
        .filter_map(|s| overhead_parts(s, reference.train_s).map(|p| (s, p)))
        .collect();
    if rows.is_empty() {
        let area = root
            .titled("Training-time overhead", title_style())
            .map_err(err)?;
        return no_data(&area, "no strategy besides the reference finished");
    }
    let pos_max = rows
        .iter()
        .map(|(_, p)| p.iter().filter(|v| **v > 0.0).sum::<f64>())
        .fold(0.01, f64::max);
    let neg_min = rows
        .iter()
        .map(|(_, p)| p.iter().filter(|v| **v < 0.0).sum::<f64>())
        .fold(0.0, f64::min);
    // Headroom above the tallest bar for its label and, above that, the legend.
    let (lo, hi) = (neg_min * 1.3 - 0.01, pos_max * 1.6);
    let n = rows.len();
    let labels: Vec<String> = rows.iter().map(|r| r.0.strategy.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption("Training-time overhead against none", title_style())
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.6..(n as f64 - 0.4), lo * 100.0..hi * 100.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("% of the reference's training time")
        .y_label_formatter(&|v| format!("{v:.0}%"))
        .label_style(style(15))
        .axis_desc_style(style(17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    let comp = [
        ("save pauses", RGBColor(255, 127, 14)),
        ("failures", RGBColor(214, 39, 40)),
        ("rest (slower steps, noise)", RGBColor(150, 150, 150)),
    ];
    for (ci, (name, c)) in comp.iter().enumerate() {
        let c = *c;
        let rects: Vec<Rectangle<(f64, f64)>> = rows
            .iter()
            .enumerate()
            .map(|(i, (_, p))| {
                // Positive parts stack up from zero, negative ones down.
                let v = p[ci];
                let base: f64 = p[..ci].iter().filter(|x| (**x > 0.0) == (v > 0.0)).sum();
                let (a, b) = (base, base + v);
                Rectangle::new(
                    [(i as f64 - 0.3, a * 100.0), (i as f64 + 0.3, b * 100.0)],
                    c.filled(),
                )
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            vec![(-0.6, 0.0), (n as f64 - 0.4, 0.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    for (i, (s, p)) in rows.iter().enumerate() {
        let total = s.overhead.unwrap_or(0.0);
        let top = p.iter().filter(|v| **v > 0.0).sum::<f64>();
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{:+.1}%", total * 100.0),
                (i as f64 - 0.12, (top + (hi - lo) * 0.06) * 100.0),
                style(16).color(&color(&s.strategy)),
            )))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(style(15))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn bar_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    groups: &[(String, Vec<(f64, RGBColor)>)],
    series_names: &[(&str, RGBColor)],
) -> Res {
    let n = groups.len();
    let k = groups.iter().map(|g| g.1.len()).max().unwrap_or(1).max(1);
    let vals = groups.iter().flat_map(|g| g.1.iter().map(|v| v.0));
    let (mut lo, mut hi) = (0.0f64, 1e-3f64);
    for v in vals {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let span = hi - lo;
    let (lo, hi) = (lo - 0.1 * span * (lo < 0.0) as u8 as f64, hi + 0.2 * span);
    let labels: Vec<String> = groups.iter().map(|g| g.0.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20).into_font().style(FontStyle::Bold))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.6..(n as f64 - 0.4), lo..hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style(style(14))
        .axis_desc_style(style(16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    let w = 0.7 / k as f64;
    for (gi, (_, vals)) in groups.iter().enumerate() {
        for (j, (v, c)) in vals.iter().enumerate() {
            let x0 = gi as f64 - 0.35 + j as f64 * w;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0 + 0.02, 0.0), (x0 + w - 0.02, *v)],
                    c.filled(),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{v:.1}"),
                    (x0 + 0.03, v.max(0.0) + (hi - lo) * 0.04),
                    style(13),
                )))
                .map_err(err)?;
        }
    }
    for (name, c) in series_names {
        let c = *c;
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
    }
    if !series_names.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .label_font(style(14))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn memory_storage<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rep: &CompareReport) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled("Extra memory and bytes stored", title_style())
        .map_err(err)?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mem: Vec<(String, Vec<(f64, RGBColor)>)> = rep
        .summary
        .iter()
        .filter(|s| s.strategy != "none")
        .filter_map(|s| {
            Some((
                s.strategy.clone(),
                vec![(mib(s.extra_server_rss_bytes? as f64), color(&s.strategy))],
            ))
        })
        .collect();
    if mem.is_empty() {
        no_data(&left, "server memory was not sampled")?;
    } else {
        bar_panel(
            &left,
            "Peak server memory beyond none",
            "MiB (all servers)",
            &mem,
            &[],
        )?;
    }
    let written = RGBColor(31, 119, 180);
    let stored = RGBColor(44, 160, 44);
    let io: Vec<(String, Vec<(f64, RGBColor)>)> = rep
        .summary
        .iter()
        .filter(|s| s.status == "ok")
        .map(|s| {
            (
                s.strategy.clone(),
                vec![
                    (mib(s.bytes_written as f64), written),
                    (mib(s.stored_bytes as f64), stored),
                ],
            )
        })
        .collect();
    bar_panel(
        &right,
        "Bytes written and stored",
        "MiB",
        &io,
        &[("written", written), ("stored at the end", stored)],
    )
}

fn quality<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rep: &CompareReport) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled("Model quality against the failure-free run", title_style())
        .map_err(err)?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    let reference = rep.reference();
    let rows: Vec<&SummaryRow> = rep.summary.iter().filter(|s| s.status == "ok").collect();
    type Pick = fn(&SummaryRow) -> Option<f64>;
    type Panel<'a, DB> = (&'a DrawingArea<DB, Shift>, &'a str, Pick, Option<f64>);
    let panels: [Panel<DB>; 2] = [
        (
            &left,
            "AUC (higher is better)",
            |s| s.auc,
            reference.and_then(|r| r.auc),
        ),
        (
            &right,
            "logloss (lower is better)",
            |s| s.logloss,
            reference.and_then(|r| r.logloss),
        ),
    ];
    for (area, title, pick, refv) in panels {
        let pts: Vec<(usize, f64, &SummaryRow)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, s)| pick(s).map(|v| (i, v, *s)))
            .collect();
        if pts.is_empty() {
            no_data(area, "no held-out evaluation (--eval-samples 0)")?;
            continue;
        }
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in &pts {
            lo = lo.min(p.1);
            hi = hi.max(p.1);
        }
        let pad = ((hi - lo) * 0.5).max(0.002);
        let n = rows.len();
        let labels: Vec<String> = rows.iter().map(|s| s.strategy.clone()).collect();
        let mut chart = ChartBuilder::on(area)
            .caption(title, (FONT, 20).into_font().style(FontStyle::Bold))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.6..(n as f64 - 0.4), (lo - pad)..(hi + pad))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{v:.4}"))
            .label_style(style(14))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        if let Some(r) = refv {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(-0.6, r), (n as f64 - 0.4, r)],
                    8,
                    5,
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(err)?
                .label("failure-free reference")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.mix(0.6)));
        }
        for (i, v, s) in &pts {
            let c = color(&s.strategy);
            chart
                .draw_series(std::iter::once(Circle::new((*i as f64, *v), 7, c.filled())))
                .map_err(err)?;
            let tag = match s.digest_matches {
                Some(true) if s.strategy != "none" => " = digest".to_string(),
                _ => String::new(),
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{v:.4}{tag}"),
                    (*i as f64 - 0.25, *v + pad * 0.35),
                    style(13),
                )))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .label_font(style(13))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// One point of CPR §6.3's sensitivity plot.
pub struct SensitivityPoint {
    pub variant: String,
    pub target_pls: f64,
    pub overhead_share: f64,
    pub auc_drop: Option<f64>,
    pub auc_drop_ci95: Option<f64>,
}

/// One series of CPR §6.5's scatter: a variant's runs and its least-squares line.
pub struct SweepSeries<'a> {
    pub name: &'static str,
    pub points: &'a [(f64, f64)],
    pub fit: Option<crate::bench_cpr_sweep::Correlation>,
}

/// CPR §6.5 (Figures 11 and 12): each run's PLS against its AUC drop and each variant's
/// least-squares line, into `out/cpr-pls-auc.png` and `.svg`.
pub fn draw_pls_sweep(series: &[SweepSeries<'_>], out: &Path) -> Result<()> {
    register_fonts()?;
    both!(out, "cpr-pls-auc", (900, 600), pls_scatter, series);
    Ok(())
}

fn pls_scatter<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    series: &[SweepSeries<'_>],
) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let title = match series.first().and_then(|s| s.fit) {
        Some(c) => format!(
            "PLS and AUC drop: CPR-vanilla's Pearson r = {:.3} over {} runs",
            c.pearson, c.n
        ),
        None => "PLS and AUC drop".into(),
    };
    let area = root.titled(&title, title_style()).map_err(err)?;
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if all.is_empty() {
        return no_data(&area, "no run with a PLS and an AUC");
    }
    let x_max = all.iter().map(|p| p.0).fold(1e-3f64, f64::max) * 1.08;
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for p in &all {
        lo = lo.min(p.1);
        hi = hi.max(p.1);
    }
    let pad = ((hi - lo) * 0.08).max(1e-4);
    let mut chart = ChartBuilder::on(&area)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("PLS (Eq. 3)")
        .y_desc("AUC drop against the failure-free run")
        .label_style(style(15))
        .axis_desc_style(style(17))
        .y_label_formatter(&|y| format!("{y:.4}"))
        .draw()
        .map_err(err)?;
    let palette = [RGBColor(214, 39, 40), RGBColor(31, 119, 180)];
    for (i, s) in series.iter().enumerate() {
        let c = palette[i % palette.len()];
        let label = match s.fit {
            Some(f) => format!("{} (r = {:.2}, slope {:.4})", s.name, f.pearson, f.slope),
            None => s.name.to_string(),
        };
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 5, c.mix(0.75).filled())),
            )
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
        // The fit over the series' own range of PLS, not beyond it.
        let (x0, x1) = s
            .points
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                (a.min(p.0), b.max(p.0))
            });
        if let (Some(f), true) = (s.fit, x0 < x1) {
            chart
                .draw_series(LineSeries::new(
                    [x0, x1].map(|x| (x, f.slope * x + f.intercept)),
                    ShapeStyle::from(&c).stroke_width(2),
                ))
                .map_err(err)?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// The series labels of `chart` at `pos`, on a white box.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Res {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(style(15))
        .draw()
        .map_err(err)
}

/// CPR §6.3 (Figure 9): overhead and AUC drop against the target PLS, one line per variant,
/// into `out/cpr-sensitivity.png` and `.svg`.
pub fn draw_cpr_sensitivity(points: &[SensitivityPoint], out: &Path) -> Result<()> {
    register_fonts()?;
    both!(out, "cpr-sensitivity", (1200, 520), sensitivity, points);
    Ok(())
}

fn sensitivity<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    points: &[SensitivityPoint],
) -> Res {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "CPR's target PLS: overhead and accuracy (mean, 95% interval)",
            title_style(),
        )
        .map_err(err)?;
    if points.is_empty() {
        return no_data(&root, "no target PLS measured");
    }
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    let x_max = points.iter().map(|p| p.target_pls).fold(1e-3f64, f64::max) * 1.1;
    let mut variants: Vec<&str> = points.iter().map(|p| p.variant.as_str()).collect();
    variants.dedup();
    variants.sort_unstable();
    variants.dedup();
    let palette = [RGBColor(214, 39, 40), RGBColor(31, 119, 180)];
    type Pick = fn(&SensitivityPoint) -> Option<(f64, f64)>;
    // The overhead falls as the target rises and the AUC drop grows: each legend where its
    // lines are not.
    let panels: [(&DrawingArea<DB, Shift>, &str, Pick, SeriesLabelPosition); 2] = [
        (
            &left,
            "overhead (% of training time)",
            |p| Some((p.overhead_share * 100.0, 0.0)),
            SeriesLabelPosition::UpperRight,
        ),
        (
            &right,
            "AUC drop against full recovery",
            |p| p.auc_drop.map(|d| (d, p.auc_drop_ci95.unwrap_or(0.0))),
            SeriesLabelPosition::UpperLeft,
        ),
    ];
    for (area, desc, pick, pos) in panels {
        let vals: Vec<(f64, f64)> = points.iter().filter_map(pick).collect();
        if vals.is_empty() {
            no_data(area, "not measured")?;
            continue;
        }
        let lo = vals.iter().map(|v| v.0 - v.1).fold(0.0f64, f64::min);
        let hi = vals.iter().map(|v| v.0 + v.1).fold(0.0f64, f64::max);
        let pad = ((hi - lo) * 0.1).max(1e-4);
        let mut chart = ChartBuilder::on(area)
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("target PLS")
            .y_desc(desc)
            .label_style(style(15))
            .axis_desc_style(style(16))
            .draw()
            .map_err(err)?;
        for (vi, v) in variants.iter().enumerate() {
            let c = palette[vi % palette.len()];
            let mut pts: Vec<(f64, f64, f64)> = points
                .iter()
                .filter(|p| p.variant == *v)
                .filter_map(|p| pick(p).map(|(y, e)| (p.target_pls, y, e)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, p.1)),
                    ShapeStyle::from(&c).stroke_width(2),
                ))
                .map_err(err)?
                .label(v.to_string())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], ShapeStyle::from(&c).stroke_width(2))
                });
            chart
                .draw_series(
                    pts.iter().map(|p| {
                        ErrorBar::new_vertical(p.0, p.1 - p.2, p.1, p.1 + p.2, c.filled(), 8)
                    }),
                )
                .map_err(err)?;
        }
        legend(&mut chart, pos)?;
    }
    Ok(())
}
