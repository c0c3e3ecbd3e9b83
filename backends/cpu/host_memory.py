"""The host's RAM as the OS reports it now (/proc/meminfo), and whether a load-time copy fits."""

_UNKNOWN = 4 * 2**30  # what a host that cannot tell is assumed to have
COPY_RESERVE = 2**30  # RAM a load-time weight copy leaves free at least (also a tenth of the total)


def meminfo_bytes(key: str) -> int:
    """Bytes of /proc/meminfo's `key` (MemAvailable, MemTotal), or 4 GiB if it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _UNKNOWN


def copy_fits(nbytes: int) -> bool:
    """Whether copying nbytes of weights into the CPU's own layout (grouped rows, row pairs) leaves
    COPY_RESERVE or a tenth of the RAM available: past that a weight stays the file's mapping,
    which the OS can page (slower, never out of memory)."""
    reserve = max(COPY_RESERVE, meminfo_bytes("MemTotal") // 10)
    return meminfo_bytes("MemAvailable") - nbytes >= reserve
