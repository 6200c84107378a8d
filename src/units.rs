//! Byte sizes: parsing what users write (`"24GiB"`, `1073741824`) and printing them.
//!
//! Everything in gpumem uses binary units. Three printers exist because three audiences read
//! them: [`format_bytes`] for gpumem's own tables, [`torch_format_size`] for text that must match
//! PyTorch's C++ allocator messages byte for byte (the OOM error), and the `memory_summary`
//! formatter, which lives with that report.

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// Parses a size such as `512`, `"20MiB"`, `"1.5 GiB"`, `"24GB"` (read as GiB: GPU memory is
/// always binary) into bytes. Returns a message fit to show the user on failure.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size; write bytes (1073741824) or a unit (1GiB, 512MiB)".into());
    }
    if t.starts_with('-') {
        return Err(format!("size '{text}' cannot be negative"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        other => {
            return Err(format!(
                "unknown unit '{other}' in size '{text}'; use B, KiB, MiB, GiB or TiB"
            ))
        }
    };
    if num.contains('.') {
        let v: f64 = num
            .parse()
            .map_err(|_| format!("'{text}' is not a size; write bytes or e.g. 1.5GiB"))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("size '{text}' is out of range"));
        }
        if mult == 1 && v.fract() != 0.0 {
            return Err(format!("size '{text}' is not a whole number of bytes"));
        }
        Ok(bytes.round() as u64)
    } else {
        let v: u64 = num
            .parse()
            .map_err(|_| format!("'{text}' is not a size; write bytes or e.g. 24GiB"))?;
        v.checked_mul(mult)
            .ok_or_else(|| format!("size '{text}' is out of range"))
    }
}

/// The largest device gpumem simulates: 64 TiB, hundreds of times any GPU's memory and within
/// the simulated driver's address space (a larger capacity would run out of addresses before
/// memory).
pub const MAX_CAPACITY: u64 = 64 * TIB;

/// Parses a device capacity given on the command line: a size ([`parse_size`]) with a unit
/// (a bare number is refused: `24` is far likelier 24 GiB than 24 bytes), of more than 0
/// bytes and at most [`MAX_CAPACITY`].
pub fn parse_capacity(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let unitless = !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_digit() || c == '_' || c == '.');
    if unitless && parse_size(t)? > 0 {
        // `--capacity 24` meant 24 GiB far more often than 24 bytes
        return Err(format!(
            "'{t}' has no unit: write {t}GiB for a card of {t} GiB (or {t}B for bytes)"
        ));
    }
    let bytes = parse_size(text)?;
    check_capacity(bytes)?;
    Ok(bytes)
}

/// Whether `bytes` can be a simulated device's capacity; the message says why not.
pub fn check_capacity(bytes: u64) -> Result<(), String> {
    if bytes == 0 {
        return Err("must be more than 0 bytes (e.g. 24GiB)".into());
    }
    if bytes > MAX_CAPACITY {
        return Err(format!(
            "{} is more than the simulated device can hold: at most {}",
            format_bytes(bytes),
            format_bytes(MAX_CAPACITY)
        ));
    }
    Ok(())
}

/// Human size for gpumem's own output: `512 B`, `1.50 KiB`, `20.00 MiB`, `139.80 GiB`.
/// An integer with its digits grouped in threes: `13,038,973,952`.
pub fn group_digits(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < KIB {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / KIB as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", UNITS[i])
}

/// Signed variant of [`format_bytes`], for differences.
pub fn format_bytes_signed(delta: i64) -> String {
    if delta < 0 {
        format!("-{}", format_bytes(delta.unsigned_abs()))
    } else {
        format_bytes(delta as u64)
    }
}

/// Parts per million in one percent: tolerances are kept as integer parts per million so that a
/// limit computed from them is exact to the byte.
pub const PPM_PER_PERCENT: u64 = 10_000;

/// Parses a tolerance such as `"2%"`, `"0.5%"`, `"0.0001%"` or `"0"` into parts per million
/// (2% is 20000). Decimal digits are read exactly (no floating point): at most four after the
/// point, the finest a part per million can hold. Only `0` may be written without `%`, so that
/// `0.02` is never mistaken for 2% or 0.02%.
pub fn parse_percent(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let hint = "write a percentage such as 2%, 0.5% or 0";
    let Some(num) = t.strip_suffix('%').map(str::trim_end) else {
        return if !t.is_empty() && t.chars().all(|c| c == '0') {
            Ok(0)
        } else {
            Err(format!("'{text}' is not a percentage; {hint}"))
        };
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !digits(int) || !digits(frac) {
        return Err(format!("'{text}' is not a percentage; {hint}"));
    }
    if frac.len() > 4 {
        return Err(format!(
            "'{text}' is finer than gpumem keeps (four decimals of a percent, 0.0001%)"
        ));
    }
    let int: u64 = if int.is_empty() {
        0
    } else {
        int.parse()
            .map_err(|_| format!("percentage '{text}' is out of range"))?
    };
    let frac: u64 = format!("{frac:0<4}").parse().unwrap_or(0);
    int.checked_mul(PPM_PER_PERCENT)
        .and_then(|v| v.checked_add(frac))
        .ok_or_else(|| format!("percentage '{text}' is out of range"))
}

/// A tolerance in parts per million as a percentage, shortest exact form: `2%`, `0.5%`, `0%`.
pub fn format_percent(ppm: u64) -> String {
    let (int, frac) = (ppm / PPM_PER_PERCENT, ppm % PPM_PER_PERCENT);
    if frac == 0 {
        format!("{int}%")
    } else {
        let f = format!("{frac:04}");
        format!("{int}.{}%", f.trim_end_matches('0'))
    }
}

/// PyTorch's `format_size` from the C++ caching allocator (used in the OOM message):
/// two decimals, inclusive boundaries, so exactly 1 MiB prints `1024.00 KiB`.
pub fn torch_format_size(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1_048_576 {
        format!("{:.2} KiB", bytes as f64 / 1024.0)
    } else if bytes <= 1_073_741_824 {
        format!("{:.2} MiB", bytes as f64 / 1_048_576.0)
    } else {
        format!("{:.2} GiB", bytes as f64 / 1_073_741_824.0)
    }
}

/// `n` and the word for it: "1 entry", "2 entries" (`one` and `many` are the two forms).
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_group_in_threes() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(13_038_973_952), "13,038,973,952");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("20MiB").unwrap(), 20 * MIB);
        assert_eq!(parse_size("24GiB").unwrap(), 24 * GIB);
        assert_eq!(parse_size("24 GB").unwrap(), 24 * GIB);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size("1_048_576").unwrap(), MIB);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999TiB").is_err());
    }

    #[test]
    fn torch_format_boundaries() {
        assert_eq!(torch_format_size(1024), "1024 bytes");
        assert_eq!(torch_format_size(1025), "1.00 KiB");
        assert_eq!(torch_format_size(MIB), "1024.00 KiB");
        assert_eq!(torch_format_size(GIB), "1024.00 MiB");
        assert_eq!(torch_format_size(20 * MIB), "20.00 MiB");
        assert_eq!(torch_format_size(1 << 40), "1024.00 GiB");
    }

    #[test]
    fn percentages_are_exact_parts_per_million() {
        assert_eq!(parse_percent("2%").unwrap(), 20_000);
        assert_eq!(parse_percent("0.5%").unwrap(), 5_000);
        assert_eq!(parse_percent(".5%").unwrap(), 5_000);
        assert_eq!(parse_percent("0.0001%").unwrap(), 1);
        assert_eq!(parse_percent("100%").unwrap(), 1_000_000);
        assert_eq!(parse_percent(" 1.25 %").unwrap(), 12_500);
        assert_eq!(parse_percent("0").unwrap(), 0);
        assert_eq!(parse_percent("0%").unwrap(), 0);
        for bad in [
            "", "2", "0.02", "%", "-1%", "1e2%", "0.00001%", "two%", "1.2.3%",
        ] {
            assert!(parse_percent(bad).is_err(), "{bad:?}");
        }
        for ppm in [0, 1, 5_000, 12_500, 20_000, 1_000_000, 123_456] {
            assert_eq!(parse_percent(&format_percent(ppm)).unwrap(), ppm);
        }
        assert_eq!(format_percent(12_500), "1.25%");
    }

    #[test]
    fn human_format() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(20 * MIB), "20.00 MiB");
        assert_eq!(format_bytes_signed(-(MIB as i64)), "-1.00 MiB");
    }
}
