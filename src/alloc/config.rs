//! `PYTORCH_CUDA_ALLOC_CONF`: the allocator settings, parsed with PyTorch's syntax.
//!
//! PyTorch tokenises the string into words and the single characters `, : [ ]` (spaces are
//! dropped), then reads `key:value` pairs. Keys and their checks follow PyTorch 2.11
//! (`c10/core/AllocatorConfig.cpp`, `c10/cuda/CUDAAllocatorConfig.cpp`): an unknown key or a
//! value out of range is an error, never ignored.

use crate::units::MIB;

/// Request sizes are rounded to a multiple of this (and at least this).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded sizes up to this go to the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small-pool misses.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Large requests below this get one `large_segment_size` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Default segment size for 1..10 MiB requests (PyTorch's kLargeBuffer).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests of 10 MiB and more get a segment rounded up to this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Number of `roundup_power2_divisions` buckets: [0,2) MiB, [2,4) MiB, ... >= 32 GiB.
pub const ROUNDUP_BUCKETS: usize = 16;

/// The allocator's settings. `Default` is PyTorch with no `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConf {
    /// Blocks at least this big are never split (`max_split_size_mb`); `u64::MAX` = unlimited.
    pub max_split_size: u64,
    /// An oversize request may take a cached block at most this much bigger.
    pub max_non_split_rounding: u64,
    /// `garbage_collection_threshold` (0 = off); only acts while a memory fraction is set.
    pub garbage_collection_threshold: f64,
    /// Divisions per power-of-two interval, one per bucket (0 or 1 = plain 512-byte rounding).
    pub roundup_power2_divisions: [u64; ROUNDUP_BUCKETS],
    pub expandable_segments: bool,
    /// Segment size for 1..10 MiB requests and the expandable large-pool page.
    pub large_segment_size: u64,
    /// `per_process_memory_fraction` given in the config string (2.11 accepts it there).
    pub per_process_memory_fraction: Option<f64>,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_use_background_threads: bool,
    pub pinned_reserve_segment_size_mb: u64,
    pub graph_capture_record_stream_reuse: bool,
    /// The settings string as given (`''` when none), as PyTorch reports it in snapshots.
    pub raw: String,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_BUCKETS],
            expandable_segments: false,
            large_segment_size: LARGE_BUFFER,
            per_process_memory_fraction: None,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            raw: String::new(),
        }
    }
}

/// A bad settings string: what is wrong, and the token (by 1-based position) where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (in alloc conf '{conf}', at '{token}')")]
pub struct ConfError {
    pub message: String,
    pub conf: String,
    pub token: String,
}

struct Tokens<'a> {
    toks: Vec<&'a str>,
    conf: &'a str,
}

impl<'a> Tokens<'a> {
    fn new(conf: &'a str) -> Self {
        let mut toks = Vec::new();
        let mut start = None;
        for (i, c) in conf.char_indices() {
            match c {
                ',' | ':' | '[' | ']' | ' ' | '\t' | '\n' => {
                    if let Some(s) = start.take() {
                        toks.push(&conf[s..i]);
                    }
                    if c != ' ' && c != '\t' && c != '\n' {
                        toks.push(&conf[i..i + 1]);
                    }
                }
                _ => {
                    if start.is_none() {
                        start = Some(i);
                    }
                }
            }
        }
        if let Some(s) = start {
            toks.push(&conf[s..]);
        }
        Tokens { toks, conf }
    }

    fn err(&self, i: usize, message: impl Into<String>) -> ConfError {
        ConfError {
            message: message.into(),
            conf: self.conf.to_string(),
            token: self
                .toks
                .get(i)
                .map(|s| s.to_string())
                .unwrap_or_else(|| "<end>".into()),
        }
    }

    fn get(&self, i: usize) -> Result<&'a str, ConfError> {
        self.toks
            .get(i)
            .copied()
            .ok_or_else(|| self.err(i, "unexpected end of settings"))
    }

    fn expect(&self, i: usize, what: &str) -> Result<(), ConfError> {
        let t = self.get(i)?;
        if t == what {
            Ok(())
        } else {
            Err(self.err(i, format!("expected '{what}'")))
        }
    }

    fn uint(&self, i: usize, key: &str) -> Result<u64, ConfError> {
        let t = self.get(i)?;
        t.parse::<u64>()
            .map_err(|_| self.err(i, format!("{key} expects a non-negative integer")))
    }

    fn float(&self, i: usize, key: &str) -> Result<f64, ConfError> {
        let t = self.get(i)?;
        t.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.err(i, format!("{key} expects a number")))
    }

    fn boolean(&self, i: usize, key: &str) -> Result<bool, ConfError> {
        match self.get(i)? {
            "True" | "true" => Ok(true),
            "False" | "false" => Ok(false),
            _ => Err(self.err(i, format!("{key} expects True or False"))),
        }
    }
}

/// The keys PyTorch 2.11 accepts, for error messages.
pub const KNOWN_KEYS: &[&str] = &[
    "backend",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "large_segment_size_mb",
    "per_process_memory_fraction",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
];

impl AllocConf {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string (`""` gives the defaults).
    pub fn parse(conf: &str) -> Result<AllocConf, ConfError> {
        let mut c = AllocConf {
            raw: conf.to_string(),
            ..AllocConf::default()
        };
        let t = Tokens::new(conf);
        let mut i = 0;
        while i < t.toks.len() {
            let key = t.toks[i];
            if key == "," {
                i += 1;
                continue;
            }
            if !KNOWN_KEYS.contains(&key) {
                return Err(t.err(
                    i,
                    format!(
                        "unrecognized key '{key}'; PyTorch 2.11 knows: {}",
                        KNOWN_KEYS.join(", ")
                    ),
                ));
            }
            t.expect(i + 1, ":")?;
            i += 2;
            match key {
                "backend" => {
                    match t.get(i)? {
                        "native" => {}
                        "cudaMallocAsync" => return Err(t.err(
                            i,
                            "backend:cudaMallocAsync hands memory management to the CUDA driver; \
                             gpumem models the native caching allocator only",
                        )),
                        _ => return Err(t.err(i, "backend expects native or cudaMallocAsync")),
                    }
                }
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb = t.uint(i, key)?;
                    let min = LARGE_BUFFER / MIB;
                    if mb < min {
                        return Err(t.err(i, format!("{key} too small, must be >= {min}")));
                    }
                    let bytes = mb.saturating_mul(MIB);
                    if key == "max_split_size_mb" {
                        c.max_split_size = bytes;
                    } else {
                        c.max_non_split_rounding = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let v = t.float(i, key)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(t.err(
                            i,
                            "garbage_collection_threshold must be between 0.0 and 1.0, exclusive",
                        ));
                    }
                    c.garbage_collection_threshold = v;
                }
                "roundup_power2_divisions" => {
                    i = parse_roundup(&t, i, &mut c.roundup_power2_divisions)?;
                }
                "expandable_segments" => c.expandable_segments = t.boolean(i, key)?,
                "release_lock_on_cudamalloc" => c.release_lock_on_cudamalloc = t.boolean(i, key)?,
                "pinned_use_cuda_host_register" => {
                    c.pinned_use_cuda_host_register = t.boolean(i, key)?
                }
                "pinned_use_background_threads" => {
                    c.pinned_use_background_threads = t.boolean(i, key)?
                }
                "graph_capture_record_stream_reuse" => {
                    c.graph_capture_record_stream_reuse = t.boolean(i, key)?
                }
                "pinned_num_register_threads" => {
                    let v = t.uint(i, key)?;
                    if !v.is_power_of_two() || v > 128 {
                        return Err(t.err(
                            i,
                            "pinned_num_register_threads must be a power of two, at most 128",
                        ));
                    }
                    c.pinned_num_register_threads = v;
                }
                "pinned_reserve_segment_size_mb" => {
                    let v = t.uint(i, key)?;
                    if v == 0 {
                        return Err(t.err(i, "pinned_reserve_segment_size_mb must be > 0"));
                    }
                    c.pinned_reserve_segment_size_mb = v;
                }
                "large_segment_size_mb" => {
                    let v = t.uint(i, key)?;
                    if v <= MIN_LARGE_ALLOC / MIB {
                        return Err(t.err(i, "large_segment_size_mb must be > 10"));
                    }
                    // a segment past any device gpumem simulates (and past u64 in bytes)
                    if v > (64u64 << 40) / MIB {
                        return Err(t.err(
                            i,
                            format!(
                                "large_segment_size_mb must be at most {} (64 TiB), found {v}",
                                (64u64 << 40) / MIB
                            ),
                        ));
                    }
                    c.large_segment_size = v.saturating_mul(MIB);
                }
                "per_process_memory_fraction" => {
                    let v = t.float(i, key)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(t.err(i, "per_process_memory_fraction must be in [0, 1]"));
                    }
                    c.per_process_memory_fraction = Some(v);
                }
                _ => unreachable!("key checked against KNOWN_KEYS"),
            }
            i += 1;
            if i < t.toks.len() {
                t.expect(i, ",")?;
            }
        }
        Ok(c)
    }

    /// Divisions for a (rounded-to-512 or raw) request size: bucket `floor(log2(size)) - 20`,
    /// clamped to the 16 buckets.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let idx = (log - 20).clamp(0, ROUNDUP_BUCKETS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `max_split_size` as `memory_stats()` reports it: -1 when unlimited.
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == u64::MAX {
            -1
        } else {
            self.max_split_size as i64
        }
    }
}

/// `roundup_power2_divisions:N` or `:[256:1,512:2,>:8]` (keys in MiB). Returns the index of the
/// value's last token.
fn parse_roundup(
    t: &Tokens,
    mut i: usize,
    out: &mut [u64; ROUNDUP_BUCKETS],
) -> Result<usize, ConfError> {
    let key = "roundup_power2_divisions";
    if t.get(i)? != "[" {
        let v = t.uint(i, key)?;
        if !v.is_power_of_two() {
            return Err(t.err(i, "roundup_power2_divisions must be a power of two"));
        }
        out.fill(v);
        return Ok(i);
    }
    let mut last_index: Option<usize> = None;
    loop {
        i += 1;
        let tok = t.get(i)?;
        if tok == "]" {
            return Ok(i);
        }
        let key_at = i;
        t.expect(i + 1, ":")?;
        i += 2;
        let v = t.uint(i, key)?;
        if v != 0 && !v.is_power_of_two() {
            return Err(t.err(
                i,
                "roundup divisions must be a power of two, or 0 to disable",
            ));
        }
        if tok == ">" {
            let from = last_index.map(|l| l + 1).unwrap_or(0);
            for slot in out.iter_mut().skip(from) {
                *slot = v;
            }
        } else {
            let mb = t.uint(key_at, key)?;
            if !mb.is_power_of_two() {
                return Err(t.err(key_at, "roundup interval keys (MiB) must be powers of two"));
            }
            let idx = (mb.trailing_zeros() as usize).min(ROUNDUP_BUCKETS - 1);
            let from = match last_index {
                None => 0,
                Some(l) => l + 1,
            };
            for slot in out.iter_mut().take(idx).skip(from) {
                // the first key also fills every bucket below it
                if last_index.is_none() {
                    *slot = v;
                }
            }
            out[idx] = v;
            last_index = Some(idx);
        }
        match t.get(i + 1)? {
            "]" => {}
            "," => i += 1,
            _ => {
                return Err(t.err(
                    i + 1,
                    "expected ',' or ']' in roundup_power2_divisions list",
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = AllocConf::parse("").unwrap();
        assert_eq!(c, AllocConf::default());
        assert_eq!(c.max_split_size_stat(), -1);
    }

    #[test]
    fn keys_and_values() {
        let c = AllocConf::parse(
            "max_split_size_mb:64, expandable_segments:True,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 64 * MIB);
        assert!(c.expandable_segments);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        let c = AllocConf::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
    }

    #[test]
    fn roundup_list() {
        let c = AllocConf::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(&d[..9], &[1; 9]);
        assert_eq!(d[9], 2);
        assert_eq!(d[10], 4);
        assert_eq!(&d[11..], &[8; 5]);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = AllocConf::parse("max_split_size_mb:10").unwrap_err();
        assert!(e.message.contains("too small"), "{e}");
        let e = AllocConf::parse("expandable_segment:True").unwrap_err();
        assert!(
            e.to_string()
                .contains("unrecognized key 'expandable_segment'"),
            "{e}"
        );
        assert!(AllocConf::parse("expandable_segments:yes").is_err());
        assert!(AllocConf::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocConf::parse("roundup_power2_divisions:[256:1").is_err());
        assert!(AllocConf::parse("garbage_collection_threshold:1.5").is_err());
        assert!(AllocConf::parse("max_split_size_mb").is_err());
        assert!(AllocConf::parse("backend:cudaMallocAsync").is_err());
    }
}
