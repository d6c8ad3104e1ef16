//! The two exposition formats and their negotiation: OpenMetrics text, which Prometheus asks
//! for, and the classic text format 0.0.4 derived from it for every other scraper.

/// The `Content-Type` of [`Metrics::encode`](super::Metrics::encode)'s output (OpenMetrics text, which Prometheus scrapes).
///
/// # Examples
///
/// ```
/// assert!(worker_registry::metrics::CONTENT_TYPE.starts_with("application/openmetrics-text"));
/// ```
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of the classic Prometheus text format ([`Metrics::encode_text`](super::Metrics::encode_text)).
///
/// # Examples
///
/// ```
/// assert!(worker_registry::metrics::TEXT_CONTENT_TYPE.contains("version=0.0.4"));
/// ```
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition format of `/metrics`.
///
/// # Examples
///
/// ```
/// use worker_registry::metrics::Format;
///
/// let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
/// assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
/// assert_eq!(Format::from_accept(Some("text/plain; version=0.0.4")), Format::Text);
/// assert_eq!(Format::from_accept(None), Format::Text);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// OpenMetrics 1.0 text ([`CONTENT_TYPE`]).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 ([`TEXT_CONTENT_TYPE`]), which every scraper reads.
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a higher quality than `text/plain` (Prometheus does),
    /// the classic text format otherwise (no header, `*/*`, `text/plain`, or nothing acceptable).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::metrics::Format;
    ///
    /// // Prometheus's own header prefers OpenMetrics; a browser's or curl's gets the classic text.
    /// let prometheus = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    /// assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
    /// assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
    /// ```
    pub fn from_accept(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Text;
        };
        let mut best: Option<(u32, Self)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut q = 1000;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = parse_q(v.trim()).unwrap_or(0);
                    }
                }
            }
            let format = if media.eq_ignore_ascii_case("application/openmetrics-text") {
                Self::OpenMetrics
            } else if media.eq_ignore_ascii_case("text/plain")
                || media.eq_ignore_ascii_case("text/*")
                || media == "*/*"
            {
                Self::Text
            } else {
                continue;
            };
            // On equal quality, the classic format wins unless OpenMetrics came first.
            if q > 0 && best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, format));
            }
        }
        best.map_or(Self::Text, |(_, f)| f)
    }

    /// The `Content-Type` to answer with.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::metrics::{Format, CONTENT_TYPE, TEXT_CONTENT_TYPE};
    ///
    /// assert_eq!(Format::OpenMetrics.content_type(), CONTENT_TYPE);
    /// assert_eq!(Format::Text.content_type(), TEXT_CONTENT_TYPE);
    /// ```
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => CONTENT_TYPE,
            Self::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// An HTTP quality value (`0` .. `1` with up to three decimals) in thousandths.
pub(super) fn parse_q(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u32 = format!("{frac:0<3}").parse().ok()?;
    match int {
        "0" => Some(frac),
        "1" if frac == 0 => Some(1000),
        _ => None,
    }
}

/// The byte offset just past a sample line's label set (`name{...}`), quotes and escapes
/// respected; `None` if it has no labels.
fn labels_end(line: &str) -> Option<usize> {
    let open = line.find(['{', ' '])?;
    if line.as_bytes()[open] != b'{' {
        return None;
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, b) in line.bytes().enumerate().skip(open + 1) {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => quoted = !quoted,
            (false, _, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Rewrites OpenMetrics text (as prometheus-client writes it) in the classic text format 0.0.4.
pub(super) fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<(&str, String)> = None;
    // The family being written: its OpenMetrics name and type.
    let mut family: (&str, &str) = ("", "");
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in help texts; the classic format does not.
            help = Some((name, text.replace("\\\"", "\"")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = (name, kind);
            let (text_name, text_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                "stateset" => (name.to_owned(), "gauge"),
                "gaugehistogram" => (name.to_owned(), "histogram"),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some((h, text)) = help.take() {
                if h == name {
                    out.push_str(&format!("# HELP {text_name} {text}\n"));
                }
            }
            out.push_str(&format!("# TYPE {text_name} {text_kind}\n"));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, _) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
        if family.1 == "counter" && name.strip_prefix(family.0) == Some("_created") {
            continue;
        }
        // An exemplar follows ` # ` after the value; the classic format has none.
        let labels_end = labels_end(line).unwrap_or(0);
        let sample = match line[labels_end..].find(" # ") {
            Some(i) => &line[..labels_end + i],
            None => line,
        };
        out.push_str(sample);
        out.push('\n');
    }
    out
}
