//! The process's own figures for `/metrics`, under the names Prometheus clients use for them
//! (`process_*`), read from `/proc/self` on Linux at each scrape; elsewhere there are none.

/// What a scrape reports of the process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

/// The fields of `/proc/self/stat` this needs, counted from the one after the command name
/// (which may hold spaces and parentheses, so the text is split after its last `)`): state is
/// field 3 of the file, and `proc(5)` numbers utime 14, stime 15, starttime 22, vsize 23, rss 24.
struct StatFields {
    utime_ticks: u64,
    stime_ticks: u64,
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

fn parse_stat(stat: &str) -> Option<StatFields> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 of the file.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatFields {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The soft limit on open files, from `/proc/self/limits`.
fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The system's boot time in seconds since the epoch, from `/proc/stat`.
fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Reads the figures now; `None` where `/proc` is not there to read.
#[cfg(target_os = "linux")]
pub fn read() -> Option<ProcessFigures> {
    let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    // SAFETY: sysconf only reads a system constant.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks_per_second = u64::try_from(ticks_per_second).ok().filter(|t| *t > 0)? as f64;
    // SAFETY: as above.
    let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)? as f64;
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as u64);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| parse_max_open_files(&l));
    Some(ProcessFigures {
        cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / ticks_per_second,
        resident_bytes: stat.rss_pages * page_size,
        virtual_bytes: stat.vsize_bytes,
        start_time_seconds: boot + stat.start_ticks as f64 / ticks_per_second,
        open_fds,
        max_fds,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn read() -> Option<ProcessFigures> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (run (nel) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 75 0 0 20 0 \
                    9 0 123456 104857600 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17920";
        let fields = parse_stat(stat).expect("parsed");
        assert_eq!(fields.utime_ticks, 250);
        assert_eq!(fields.stime_ticks, 75);
        assert_eq!(fields.start_ticks, 123456);
        assert_eq!(fields.vsize_bytes, 104857600);
        assert_eq!(fields.rss_pages, 2048);
        assert!(parse_stat("4242 (runnel) S 1 2").is_none());
    }

    #[test]
    fn the_open_files_limit_is_the_soft_one() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_alive_with_memory_and_open_files() {
        let figures = read().expect("figures");
        assert!(figures.resident_bytes > 0 && figures.virtual_bytes >= figures.resident_bytes);
        assert!(figures.open_fds.is_some_and(|n| n >= 3));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            figures.start_time_seconds <= now + 1.0
                && figures.start_time_seconds > now - 86_400.0 * 365.0
        );
    }
}
