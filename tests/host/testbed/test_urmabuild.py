"""obmm.testbed.builds.urmabuild: which warnings of an upstream UB tree's build are
whose, and what an older guest kernel adds to its flags.  No build here: the stage builds (make
patch-check)."""

from __future__ import annotations

from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.builds import urmabuild

TREE = Path("/tmp/scratch/tree")
UBCORE = TREE / "drivers/ub/urma/ubcore"


def test_warnings_are_the_series_ours_or_upstreams(tmp_path: Path) -> None:
    compat = paths.kmod_dir() / "urma_compat"
    output = "\n".join(
        [
            f"  CC [M]  {UBCORE}/ubcore_seg_map.o",
            f"{UBCORE}/ubcore_seg_map.c:40:6: warning: unused variable 'x' [-Wunused-variable]",
            f"{UBCORE}/ubcore_segment.c:21:25: warning: no previous prototype for 'f' "
            "[-Wmissing-prototypes]",
            f"{UBCORE}/ubcore_segment.c:320:9: warning: unused variable 'y' [-Wunused-variable]",
            f"{UBCORE}/ubcore_perf.c:44: warning: This comment starts with '/**', but isn't a "
            "kernel-doc comment. Refer Documentation/doc-guide/kernel-doc.rst",
            f"{compat}/urma_compat.h:30:1: warning: no previous prototype [-Wmissing-prototypes]",
            'WARNING: modpost: "x" [ubcore.ko] undefined!',
            f"{UBCORE}/ubcore_segment.c:320:9: note: declared here",
        ]
    )
    series = {
        "drivers/ub/urma/ubcore/ubcore_seg_map.c": set(range(1, 100)),
        "drivers/ub/urma/ubcore/ubcore_segment.c": {318, 319, 320},
    }
    got = urmabuild.classify(output, "ubcore", TREE, series, [compat])
    assert [(w.origin, w.file, w.line, w.flag) for w in got] == [
        ("series", "drivers/ub/urma/ubcore/ubcore_seg_map.c", 40, "-Wunused-variable"),
        ("upstream", "drivers/ub/urma/ubcore/ubcore_segment.c", 21, "-Wmissing-prototypes"),
        ("series", "drivers/ub/urma/ubcore/ubcore_segment.c", 320, "-Wunused-variable"),
        ("upstream", "drivers/ub/urma/ubcore/ubcore_perf.c", 44, "kernel-doc"),
        ("compat", "kmod/urma_compat/urma_compat.h", 30, "-Wmissing-prototypes"),
        ("upstream", "", 0, ""),
    ]
    assert got[0].message == "warning: unused variable 'x' [-Wunused-variable]"
    assert got[0].where() == "drivers/ub/urma/ubcore/ubcore_seg_map.c:40"
    built = urmabuild.UrmaModules({}, tuple(got), tmp_path / "log")
    assert built.count("upstream") == 3 and built.count("series", "uburma") == 0
    assert built.by_flag("upstream") == {"-Wmissing-prototypes": 1, "kernel-doc": 1, "other": 1}


def test_only_kernels_older_than_the_trees_target_get_the_compat_pieces() -> None:
    flags = urmabuild.compat_flags("6.1.0-57-amd64")
    assert flags[:2] == ["-include", str(paths.kmod_dir() / "urma_compat" / "urma_compat.h")]
    assert "-Wno-error=incompatible-pointer-types" in flags
    assert Path(flags[1]).is_file()
    assert urmabuild.compat_flags("6.6.0-28.0.0.34.oe2403.aarch64") == []
    assert urmabuild.compat_flags("6.12.118+deb13-amd64") == []
