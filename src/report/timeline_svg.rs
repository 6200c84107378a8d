//! The memory timeline ([`Timeline`]) as an SVG chart, for `gpumem plot` and `gpumem run --plot`.
//!
//! The chart shows allocated memory as stacked areas, one per category (bottom first, in
//! [`Timeline::categories`] order), reserved memory as a line, a dashed line at each iteration
//! start, the peak and any out-of-memory failures as labelled markers, and the device capacity
//! as a dashed limit line when it is close enough to the data to be worth drawing.
//!
//! Drawing is done with `plotters`' SVG backend, built without default features so that no
//! system font library is linked. That backend cannot group elements or name them, so each part
//! of the chart is drawn on its own canvas with the same geometry and the bodies are then joined
//! into one document, each inside a `<g>` that says what it is (`class="area"
//! data-series="activation"`, `id="peak"`, ...). Tests, and anyone post-processing the file,
//! can therefore find a series without guessing from colours.
//!
//! Text widths are estimated (plotters' naive font module, about 0.7 em per character, which
//! over-estimates most real fonts), so the layout below keeps generous room for labels.

use std::fmt::Write as _;
use std::ops::Range;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::analysis::timeline::{Sample, Timeline};
use crate::units::{format_bytes, GIB, KIB, MIB, TIB};

/// Size of the document in pixels.
pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 600;

const FONT: &str = "sans-serif";
/// Font sizes as plotters takes them; it writes `font-size` as this divided by 1.24.
const TITLE_SIZE: f64 = 24.0;
const LABEL_SIZE: f64 = 16.0;
const AXIS_DESC_SIZE: f64 = 18.0;
/// Width estimate per character, in em of the written font size (plotters' naive estimate);
/// wider than most sans-serif text, so labels spaced by it do not touch.
const EM_PER_CHAR: f64 = 0.7;

/// Where the plot rectangle sits. The top leaves a strip under the title for the iteration
/// labels, which are drawn above the plot so they never cover the data or the peak label.
const PLOT_TOP: i32 = 76;
const PLOT_BOTTOM_AREA: u32 = 56;
const PLOT_LEFT_AREA: u32 = 104;
/// Keeps the axis descriptions off the edges of the picture.
const OUTER_MARGIN: u32 = 8;
const LEGEND_GAP: i32 = 24;

/// Headroom above the highest value so that the labels above the peak fit inside the plot.
const HEADROOM: f64 = 1.15;
/// The capacity line is drawn only when it is at most this many times the highest value
/// shown; a far larger capacity would squash the data into a thin strip at the bottom.
const CAPACITY_MAX_RATIO: f64 = 2.0;

const RESERVED_COLOR: RGBColor = RGBColor(0x33, 0x33, 0x33);
const ITERATION_COLOR: RGBColor = RGBColor(0x88, 0x88, 0x88);
const CAPACITY_COLOR: RGBColor = RGBColor(0x8B, 0x1A, 0x1A);
const PEAK_COLOR: RGBColor = RGBColor(0x11, 0x11, 0x11);
const OOM_COLOR: RGBColor = RGBColor(0xD6, 0x27, 0x28);
const GRID_COLOR: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);
const TEXT_COLOR: RGBColor = RGBColor(0x22, 0x22, 0x22);

/// A fixed colour per known category (Tableau 10), so the same category looks the same in
/// every chart. Red is left out: it means out-of-memory here.
fn category_color(name: &str) -> RGBColor {
    match name {
        "parameter" => RGBColor(0x4E, 0x79, 0xA7),
        "gradient" => RGBColor(0xF2, 0x8E, 0x2B),
        "optimizer_state" => RGBColor(0x59, 0xA1, 0x4F),
        "activation" => RGBColor(0xB0, 0x7A, 0xA1),
        "temporary" => RGBColor(0x76, 0xB7, 0xB2),
        "input" => RGBColor(0x9C, 0x75, 0x5F),
        "workspace" => RGBColor(0xED, 0xC9, 0x48),
        "kv_cache" => RGBColor(0xFF, 0x9D, 0xA7),
        "other" => RGBColor(0xBA, 0xB0, 0xAC),
        // Categories this file does not know get a colour by their place (`color_in`).
        _ => EXTRA[0],
    }
}

/// Colours for bands this file does not know (a PyTorch snapshot's sites), given in order so
/// that neighbouring bands differ.
const EXTRA: [RGBColor; 10] = [
    RGBColor(0x4E, 0x79, 0xA7),
    RGBColor(0xF2, 0x8E, 0x2B),
    RGBColor(0x59, 0xA1, 0x4F),
    RGBColor(0xB0, 0x7A, 0xA1),
    RGBColor(0x76, 0xB7, 0xB2),
    RGBColor(0xED, 0xC9, 0x48),
    RGBColor(0x9C, 0x75, 0x5F),
    RGBColor(0xFF, 0x9D, 0xA7),
    RGBColor(0x6B, 0x6E, 0xCF),
    RGBColor(0x8C, 0xD1, 0x7D),
];

/// The categories with a fixed colour: the trace's own (analysis::state::CATEGORIES).
const KNOWN: [&str; 9] = crate::analysis::state::CATEGORIES;
/// A band's colour in a chart of `all` bands: the fixed one of a known category, else the
/// next of [`EXTRA`] in the order the unknown bands come.
fn color_in(name: &str, all: &[String]) -> RGBColor {
    if KNOWN.contains(&name) {
        return category_color(name);
    }
    let i = all
        .iter()
        .filter(|c| !KNOWN.contains(&c.as_str()))
        .position(|c| c == name)
        .unwrap_or(0);
    EXTRA[i % EXTRA.len()]
}

/// A chart with no series: the title and one centred message (a snapshot without a trace).
pub fn render_message(title: &str, message: &str) -> String {
    message_svg(title, message)
}

/// Renders the timeline as a complete SVG document ([`WIDTH`] x [`HEIGHT`]).
///
/// Never panics: an empty timeline gives a chart saying "no allocations recorded", and a
/// drawing error gives a small SVG carrying the error text.
pub fn render(t: &Timeline) -> String {
    if t.samples.is_empty() {
        return message_svg(&t.title, "no allocations recorded");
    }
    match Chart::new(t).draw() {
        Ok(svg) => svg,
        Err(e) => message_svg(&t.title, &format!("could not draw the timeline: {e}")),
    }
}

/// A unit for the y axis: the largest binary unit not above the top of the axis, so tick
/// labels read "0 GiB, 2 GiB, 4 GiB" rather than "2147483648".
#[derive(Debug, Clone, Copy)]
struct Unit {
    bytes: u64,
    name: &'static str,
}

impl Unit {
    fn for_max(max_bytes: f64) -> Unit {
        const UNITS: [(u64, &str); 5] = [
            (TIB, "TiB"),
            (GIB, "GiB"),
            (MIB, "MiB"),
            (KIB, "KiB"),
            (1, "B"),
        ];
        let (bytes, name) = UNITS
            .into_iter()
            .find(|&(b, _)| max_bytes >= b as f64)
            .unwrap_or((1, "B"));
        Unit { bytes, name }
    }

    fn scale(self, bytes: u64) -> f64 {
        bytes as f64 / self.bytes as f64
    }

    /// A tick label: at most two decimals, trailing zeros dropped ("2 GiB", "2.5 GiB").
    /// `format_bytes` always prints two decimals and switches units below 1, which on an axis
    /// would print "512.00 MiB" next to "1.00 GiB".
    fn tick_label(self, v: f64) -> String {
        let mut s = format!("{v:.2}");
        if s.contains('.') {
            s = s.trim_end_matches('0').trim_end_matches('.').to_string();
        }
        if s == "-0" {
            s = "0".into();
        }
        format!("{s} {}", self.name)
    }
}

/// Everything the layers share: the data in chart coordinates and the plot geometry.
struct Chart<'t> {
    t: &'t Timeline,
    unit: Unit,
    x: Range<f64>,
    y: Range<f64>,
    /// Right edge of the plot rectangle; the legend sits to its right.
    plot_right: i32,
    /// Categories with any non-zero bytes, as indices into `t.categories`.
    shown: Vec<usize>,
    capacity: Option<u64>,
}

/// Bytes of category `i` in a sample; a short `by_category` reads as zero rather than panic.
fn bytes_of(s: &Sample, i: usize) -> u64 {
    s.by_category.get(i).copied().unwrap_or(0)
}

/// Allocated bytes of the categories below `i` (exclusive) and up to `i` (inclusive).
/// Sums saturate: a corrupt trace must not make the chart panic on overflow.
fn stack_bounds(s: &Sample, i: usize) -> (u64, u64) {
    let below = (0..i).fold(0u64, |sum, k| sum.saturating_add(bytes_of(s, k)));
    (below, below.saturating_add(bytes_of(s, i)))
}

/// All allocated bytes of a sample ([`Sample::allocated`], saturating).
fn allocated(s: &Sample) -> u64 {
    s.by_category
        .iter()
        .fold(0u64, |sum, &b| sum.saturating_add(b))
}

/// Estimated width in pixels of `text` drawn at plotters size `size`.
fn text_width(text: &str, size: f64) -> i32 {
    (text.chars().count() as f64 * size / 1.24 * EM_PER_CHAR).ceil() as i32
}

fn legend_labels(t: &Timeline, shown: &[usize], capacity: Option<u64>) -> Vec<String> {
    let mut labels = vec!["reserved".to_string()];
    labels.extend(shown.iter().rev().map(|&i| t.categories[i].clone()));
    if capacity.is_some() {
        labels.push("capacity".into());
    }
    labels
}

type Plot<'b> = DrawingArea<SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type Root<'b> = DrawingArea<SVGBackend<'b>, Shift>;

/// A label box placed so far, to keep later labels from overlapping it.
#[derive(Debug, Clone, Copy)]
struct Boxed {
    x0: i32,
    y0: i32,
    x1: i32,
    y1: i32,
}

impl Boxed {
    fn overlaps(&self, o: &Boxed) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
}

impl<'t> Chart<'t> {
    fn new(t: &'t Timeline) -> Chart<'t> {
        let shown: Vec<usize> = (0..t.categories.len())
            .filter(|&i| t.samples.iter().any(|s| bytes_of(s, i) > 0))
            .collect();

        let max_data = t
            .samples
            .iter()
            .map(|s| allocated(s).max(s.reserved))
            .chain(t.peak.as_ref().map(|p| p.allocated))
            .max()
            .unwrap_or(0);
        let capacity = t
            .capacity
            .filter(|&c| c > 0 && c as f64 <= max_data as f64 * CAPACITY_MAX_RATIO);
        let top_bytes = (max_data.max(capacity.unwrap_or(0)) as f64 * HEADROOM).max(1.0);
        let unit = Unit::for_max(top_bytes);

        // The x range covers every event the chart marks, not only the samples.
        let events = t
            .samples
            .iter()
            .map(|s| s.event)
            .chain(t.iterations.iter().map(|m| m.event))
            .chain(t.peak.iter().map(|p| p.event))
            .chain(t.ooms.iter().map(|o| o.event));
        let (lo, hi) = events.fold((u64::MAX, 0u64), |(lo, hi), e| (lo.min(e), hi.max(e)));
        let (lo, hi) = (lo as f64, hi as f64);
        let x = lo..if hi > lo { hi } else { lo + 1.0 };

        let legend_w = legend_labels(t, &shown, capacity)
            .iter()
            .map(|l| text_width(l, LABEL_SIZE))
            .max()
            .unwrap_or(0)
            + 40;
        let legend_w = legend_w.clamp(130, 340);
        let plot_right = WIDTH as i32 - legend_w - LEGEND_GAP;

        Chart {
            t,
            unit,
            x,
            y: 0.0..top_bytes / unit.bytes as f64,
            plot_right,
            shown,
            capacity,
        }
    }

    /// Draws every layer and joins them into one document.
    fn draw(&self) -> Result<String, String> {
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">"#
        );
        let _ = writeln!(svg, "<title>{}</title>", super::escape::xml(&self.t.title));

        svg.push_str(&self.layer(r#"id="axes""#, |root, _plot| self.draw_axes(root))?);
        for &i in &self.shown {
            let name = &self.t.categories[i];
            let attrs = format!(r#"class="area" data-series="{}""#, super::escape::xml(name));
            let body = self.layer(&attrs, |_root, plot| self.draw_area(plot, i))?;
            svg.push_str(&body);
        }
        svg.push_str(
            &self.layer(r#"class="line" data-series="reserved""#, |_r, plot| {
                self.draw_reserved(plot)
            })?,
        );
        let labelled = self.iteration_labels()?;
        for (k, mark) in self.t.iterations.iter().enumerate() {
            let attrs = format!(
                r#"class="iteration" data-label="{}""#,
                super::escape::xml(&mark.label)
            );
            svg.push_str(&self.layer(&attrs, |root, plot| {
                self.draw_iteration(root, plot, k, labelled.get(k) == Some(&true))
            })?);
        }

        // Labels inside the plot are placed one after the other, each avoiding the ones before.
        let mut placed = Vec::new();
        if let Some(cap) = self.capacity {
            svg.push_str(&self.layer(r#"id="capacity""#, |_r, plot| {
                self.draw_capacity(plot, cap, &mut placed)
            })?);
        }
        if self.t.peak.is_some() {
            svg.push_str(
                &self.layer(r#"id="peak""#, |_r, plot| self.draw_peak(plot, &mut placed))?,
            );
        }
        for k in 0..self.t.ooms.len() {
            svg.push_str(&self.layer(r#"class="oom""#, |_r, plot| {
                self.draw_oom(plot, k, &mut placed)
            })?);
        }
        svg.push_str(&self.layer(r#"id="legend""#, |root, _plot| self.draw_legend(root))?);
        svg.push_str("</svg>\n");
        Ok(svg)
    }

    /// Draws one layer on a fresh canvas with the shared geometry and returns its elements
    /// wrapped in `<g ATTRS>`. `plotters` writes one element per line between the opening
    /// `<svg ...>` line and the closing `</svg>`.
    fn layer<F>(&self, attrs: &str, draw: F) -> Result<String, String>
    where
        F: for<'b> FnOnce(&Root<'b>, &Plot<'b>) -> Result<(), String>,
    {
        let mut buf = String::new();
        {
            let root = SVGBackend::with_string(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
            let plot = self.plot_area(&root)?;
            draw(&root, &plot)?;
            root.present().map_err(|e| e.to_string())?;
        }
        let start = buf.find('\n').map_or(0, |i| i + 1);
        let end = buf.rfind("</svg>").unwrap_or(buf.len()).max(start);
        Ok(format!("<g {attrs}>\n{}</g>\n", &buf[start..end]))
    }

    /// The plot rectangle with chart coordinates; the same on every layer.
    fn plot_area<'b>(&self, root: &Root<'b>) -> Result<Plot<'b>, String> {
        let chart = self.builder(root).map_err(|e| e.to_string())?;
        Ok(chart.plotting_area().clone())
    }

    fn builder<'a, 'b>(
        &self,
        root: &'a Root<'b>,
    ) -> Result<
        ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
        DrawingAreaErrorKind<std::io::Error>,
    > {
        ChartBuilder::on(root)
            .margin_top(PLOT_TOP as u32)
            .margin_left(OUTER_MARGIN)
            .margin_bottom(OUTER_MARGIN)
            .margin_right((WIDTH as i32 - self.plot_right).max(0) as u32)
            .x_label_area_size(PLOT_BOTTOM_AREA)
            .y_label_area_size(PLOT_LEFT_AREA)
            .build_cartesian_2d(self.x.clone(), self.y.clone())
    }

    fn draw_axes(&self, root: &Root<'_>) -> Result<(), String> {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        root.fill(&WHITE).map_err(err)?;

        // The title is centred on the picture, shortened if it would not fit.
        let title = fit_title(&self.t.title);
        let style = TextStyle::from((FONT, TITLE_SIZE).into_font().style(FontStyle::Bold))
            .color(&TEXT_COLOR)
            .pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(title, (WIDTH as i32 / 2, 12), style))
            .map_err(err)?;

        let mut chart = self.builder(root).map_err(err)?;
        let unit = self.unit;
        let label_style = TextStyle::from((FONT, LABEL_SIZE).into_font()).color(&TEXT_COLOR);
        let desc_style = TextStyle::from((FONT, AXIS_DESC_SIZE).into_font()).color(&TEXT_COLOR);
        chart
            .configure_mesh()
            .bold_line_style(GRID_COLOR)
            .light_line_style(TRANSPARENT)
            .axis_style(RGBColor(0x66, 0x66, 0x66))
            .x_labels(8)
            .y_labels(8)
            .x_label_formatter(&|v| group_thousands(v.round().max(0.0) as u64))
            .y_label_formatter(&|v| unit.tick_label(*v))
            .x_label_style(label_style.clone())
            .y_label_style(label_style)
            .axis_desc_style(desc_style)
            .x_desc("allocator events")
            .y_desc("memory")
            .draw()
            .map_err(err)
    }

    /// A band of the stack: from the categories below `i` up to `i`, as a step function (memory
    /// stays as it is until the next event that changes it).
    fn draw_area(&self, plot: &Plot<'_>, i: usize) -> Result<(), String> {
        let unit = self.unit;
        let top = self.step_path(|s| unit.scale(stack_bounds(s, i).1));
        let mut points = top;
        let mut bottom = self.step_path(|s| unit.scale(stack_bounds(s, i).0));
        bottom.reverse();
        points.extend(bottom);
        let color = color_in(&self.t.categories[i], &self.t.categories);
        plot.draw(&Polygon::new(points, color.filled()))
            .map_err(|e| e.to_string())
    }

    fn draw_reserved(&self, plot: &Plot<'_>) -> Result<(), String> {
        let unit = self.unit;
        let points = self.step_path(|s| unit.scale(s.reserved));
        plot.draw(&PathElement::new(points, RESERVED_COLOR.stroke_width(2)))
            .map_err(|e| e.to_string())
    }

    /// Which iteration labels to write: left to right, each one that clears the last one
    /// written and ends before the legend. Dense iterations keep their lines but not every
    /// label, which would otherwise print on top of each other.
    fn iteration_labels(&self) -> Result<Vec<bool>, String> {
        let mut scratch = String::new();
        let root = SVGBackend::with_string(&mut scratch, (WIDTH, HEIGHT)).into_drawing_area();
        let plot = self.plot_area(&root)?;
        let mut free_from = i32::MIN;
        Ok(self
            .t
            .iterations
            .iter()
            .map(|mark| {
                let px = plot.map_coordinate(&(mark.event as f64, 0.0)).0;
                let end = px + 3 + text_width(&mark.label, LABEL_SIZE);
                let fits = px >= free_from && end <= self.plot_right + LEGEND_GAP;
                if fits {
                    free_from = end + 8;
                }
                fits
            })
            .collect())
    }

    /// The dashed line goes through the plot; the label, when `labelled`, sits above the plot
    /// just right of the line.
    fn draw_iteration(
        &self,
        root: &Root<'_>,
        plot: &Plot<'_>,
        k: usize,
        labelled: bool,
    ) -> Result<(), String> {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let mark = &self.t.iterations[k];
        let x = mark.event as f64;
        plot.draw(&DashedPathElement::new(
            [(x, self.y.start), (x, self.y.end)],
            6,
            4,
            ITERATION_COLOR.stroke_width(1),
        ))
        .map_err(err)?;

        if !labelled {
            return Ok(());
        }
        let px = plot.map_coordinate(&(x, 0.0)).0;
        let style = TextStyle::from((FONT, LABEL_SIZE).into_font())
            .color(&ITERATION_COLOR)
            .pos(Pos::new(HPos::Left, VPos::Bottom));
        root.draw(&Text::new(
            mark.label.clone(),
            (px + 3, PLOT_TOP - 6),
            style,
        ))
        .map_err(err)
    }

    fn draw_capacity(
        &self,
        plot: &Plot<'_>,
        cap: u64,
        placed: &mut Vec<Boxed>,
    ) -> Result<(), String> {
        let y = self.unit.scale(cap);
        plot.draw(&DashedPathElement::new(
            [(self.x.start, y), (self.x.end, y)],
            10,
            5,
            CAPACITY_COLOR.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?;
        let (px, py) = plot.map_coordinate(&(self.x.start, y));
        let text = format!("capacity {}", format_bytes(cap));
        self.label(plot, &text, (px + 6, py), false, CAPACITY_COLOR, placed)
    }

    fn draw_peak(&self, plot: &Plot<'_>, placed: &mut Vec<Boxed>) -> Result<(), String> {
        let Some(peak) = &self.t.peak else {
            return Ok(());
        };
        let p = plot.map_coordinate(&(peak.event as f64, self.unit.scale(peak.allocated)));
        // the reserved line where the label would go is kept clear: the label moves above it
        let reserved = self
            .t
            .samples
            .iter()
            .take_while(|s| s.event <= peak.event)
            .last()
            .map(|s| s.reserved);
        if let Some(r) = reserved {
            let ry = plot
                .map_coordinate(&(peak.event as f64, self.unit.scale(r)))
                .1;
            placed.push(Boxed {
                x0: p.0 - 160,
                y0: ry - 3,
                x1: p.0 + 160,
                y1: ry + 3,
            });
        }
        self.marker(plot, p, PEAK_COLOR)?;
        let text = format!("peak {}", format_bytes(peak.allocated));
        self.label(plot, &text, p, true, PEAK_COLOR, placed)
    }

    /// The OOM marker sits on the top of the stack at the failing event: that is what was
    /// allocated when the request could not be met.
    fn draw_oom(&self, plot: &Plot<'_>, k: usize, placed: &mut Vec<Boxed>) -> Result<(), String> {
        let oom = &self.t.ooms[k];
        let allocated = self
            .t
            .samples
            .iter()
            .take_while(|s| s.event <= oom.event)
            .last()
            .map_or(0, allocated);
        let p = plot.map_coordinate(&(oom.event as f64, self.unit.scale(allocated)));
        let size = 7;
        for (d0, d1) in [
            ((-size, -size), (size, size)),
            ((-size, size), (size, -size)),
        ] {
            plot.draw(&PathElement::new(
                [
                    self.pixel_to_coord(plot, (p.0 + d0.0, p.1 + d0.1)),
                    self.pixel_to_coord(plot, (p.0 + d1.0, p.1 + d1.1)),
                ],
                OOM_COLOR.stroke_width(3),
            ))
            .map_err(|e| e.to_string())?;
        }
        let text = format!("OOM: {}", format_bytes(oom.requested));
        self.label(plot, &text, p, true, OOM_COLOR, placed)
    }

    /// A round marker with a white ring, so it stands out on any fill colour.
    fn marker(&self, plot: &Plot<'_>, p: (i32, i32), color: RGBColor) -> Result<(), String> {
        let c = self.pixel_to_coord(plot, p);
        plot.draw(&Circle::new(c, 7, WHITE.filled()))
            .map_err(|e| e.to_string())?;
        plot.draw(&Circle::new(c, 5, color.filled()))
            .map_err(|e| e.to_string())
    }

    /// Draws `text` on a white box near pixel `anchor`: above it (centred on it when
    /// `centred`, else starting at it), moved up until it clears the labels already placed,
    /// and kept inside the plot.
    fn label(
        &self,
        plot: &Plot<'_>,
        text: &str,
        anchor: (i32, i32),
        centred: bool,
        color: RGBColor,
        placed: &mut Vec<Boxed>,
    ) -> Result<(), String> {
        let (xr, yr) = plot.get_pixel_range();
        let w = text_width(text, LABEL_SIZE) + 8;
        let h = LABEL_SIZE as i32 + 6;
        let mut x0 = if centred { anchor.0 - w / 2 } else { anchor.0 };
        x0 = x0.min(xr.end - w - 2).max(xr.start + 2);
        let mut y0 = anchor.1 - 12 - h;
        let mut b = Boxed {
            x0,
            y0,
            x1: x0 + w,
            y1: y0 + h,
        };
        for _ in 0..8 {
            if !placed.iter().any(|o| o.overlaps(&b)) {
                break;
            }
            y0 -= h + 2;
            b = Boxed {
                x0,
                y0,
                x1: x0 + w,
                y1: y0 + h,
            };
        }
        // Above the plot there is no room (the iteration labels live there): go below the
        // anchor instead.
        if b.y0 < yr.start + 2 {
            y0 = anchor.1 + 12;
            b = Boxed {
                x0,
                y0,
                x1: x0 + w,
                y1: y0 + h,
            };
        }
        placed.push(b);

        let c0 = self.pixel_to_coord(plot, (b.x0, b.y0));
        let c1 = self.pixel_to_coord(plot, (b.x1, b.y1));
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        plot.draw(&Rectangle::new([c0, c1], WHITE.mix(0.85).filled()))
            .map_err(err)?;
        let style = TextStyle::from((FONT, LABEL_SIZE).into_font().style(FontStyle::Bold))
            .color(&color)
            .pos(Pos::new(HPos::Center, VPos::Center));
        let centre = self.pixel_to_coord(plot, ((b.x0 + b.x1) / 2, (b.y0 + b.y1) / 2));
        plot.draw(&Text::new(text.to_string(), centre, style))
            .map_err(err)
    }

    fn draw_legend(&self, root: &Root<'_>) -> Result<(), String> {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let x = self.plot_right + LEGEND_GAP;
        let row = 24;
        let labels = legend_labels(self.t, &self.shown, self.capacity);
        let style = TextStyle::from((FONT, LABEL_SIZE).into_font())
            .color(&TEXT_COLOR)
            .pos(Pos::new(HPos::Left, VPos::Center));
        // a label wider than the legend keeps its end (the function of a site), after an ellipsis
        // (the legend is as wide as its longest label up to a limit: only those past it shorten)
        let room = (WIDTH as i32 - x - 30) as f64;
        let max_chars = ((room / (LABEL_SIZE / 1.24 * EM_PER_CHAR)) as usize).max(6);
        for (n, label) in labels.iter().enumerate() {
            let y = PLOT_TOP + 10 + n as i32 * row;
            match label.as_str() {
                "reserved" if n == 0 => root
                    .draw(&PathElement::new(
                        [(x, y), (x + 22, y)],
                        RESERVED_COLOR.stroke_width(2),
                    ))
                    .map_err(err)?,
                "capacity" if n == labels.len() - 1 && self.capacity.is_some() => root
                    .draw(&DashedPathElement::new(
                        [(x, y), (x + 22, y)],
                        6,
                        4,
                        CAPACITY_COLOR.stroke_width(2),
                    ))
                    .map_err(err)?,
                name => root
                    .draw(&Rectangle::new(
                        [(x + 2, y - 7), (x + 20, y + 7)],
                        color_in(name, &self.t.categories).filled(),
                    ))
                    .map_err(err)?,
            }
            root.draw(&Text::new(
                shorten_start(label, max_chars),
                (x + 30, y),
                style.clone(),
            ))
            .map_err(err)?;
        }
        Ok(())
    }

    /// Points of a step function over the samples, held to the end of the x range.
    fn step_path(&self, value: impl Fn(&Sample) -> f64) -> Vec<(f64, f64)> {
        let samples = &self.t.samples;
        let mut points = Vec::with_capacity(samples.len() * 2 + 1);
        for (j, s) in samples.iter().enumerate() {
            let v = value(s);
            points.push((s.event as f64, v));
            let next = samples.get(j + 1).map_or(self.x.end, |n| n.event as f64);
            points.push((next, v));
        }
        points
    }

    /// Inverse of the plot's mapping, for drawing pixel-sized shapes in chart coordinates.
    fn pixel_to_coord(&self, plot: &Plot<'_>, p: (i32, i32)) -> (f64, f64) {
        let (xr, yr) = plot.get_pixel_range();
        let fx = (p.0 - xr.start) as f64 / (xr.end - xr.start).max(1) as f64;
        let fy = (yr.end - p.1) as f64 / (yr.end - yr.start).max(1) as f64;
        (
            self.x.start + fx * (self.x.end - self.x.start),
            self.y.start + fy * (self.y.end - self.y.start),
        )
    }
}

/// `1234567` → `"1,234,567"`.
fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The title, cut with an ellipsis where it would run off the picture.
fn fit_title(title: &str) -> String {
    let room = WIDTH as i32 - 2 * 20;
    let max_chars = room / text_width("m", TITLE_SIZE).max(1);
    shorten(title, max_chars.max(8) as usize)
}

/// A legend label in at most `max_chars` characters: a site `file:line:function` keeps its
/// line and function and shortens its file name (`adam_fo…:267:update`); anything else keeps
/// its end after an ellipsis.
fn shorten_start(text: &str, max_chars: usize) -> String {
    let n = text.chars().count();
    if n <= max_chars {
        return text.to_string();
    }
    if let Some((file, rest)) = text.split_once(':') {
        let rest_n = rest.chars().count() + 1;
        if rest_n + 4 <= max_chars {
            let head: String = file.chars().take(max_chars - rest_n - 1).collect();
            return format!("{head}…:{rest}");
        }
    }
    let keep: String = text.chars().skip(n - max_chars.saturating_sub(1)).collect();
    format!("…{keep}")
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// A plain SVG with the title and one centred message, written by hand so it cannot fail.
fn message_svg(title: &str, message: &str) -> String {
    let full_title = super::escape::xml(title);
    let (title, message) = (
        super::escape::xml(&fit_title(title)),
        super::escape::xml(message),
    );
    format!(
        r##"<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">
<title>{full_title}</title>
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#FFFFFF"/>
<text x="{cx}" y="12" dy="0.76em" text-anchor="middle" font-family="{FONT}" font-size="{title_size}" font-weight="bold" fill="#222222">{title}</text>
<text id="message" x="{cx}" y="{cy}" text-anchor="middle" font-family="{FONT}" font-size="{message_size}" fill="#555555">{message}</text>
</svg>
"##,
        cx = WIDTH / 2,
        cy = HEIGHT / 2,
        // The sizes plotters would write for the same text in a chart.
        title_size = TITLE_SIZE / 1.24,
        message_size = AXIS_DESC_SIZE / 1.24,
    )
}

#[cfg(test)]
#[path = "timeline_svg_tests.rs"]
mod tests;
