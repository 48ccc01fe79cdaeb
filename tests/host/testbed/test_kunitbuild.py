"""obmm.testbed.builds.kunitbuild: the adaptation of Debian's lib/kunit for a kernel without
CONFIG_KUNIT, checked on text shaped like the pinned version (no download here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed.builds import kunitbuild

TEST_C = """\
static void kunit_try_run_case(void *data)
{
\tcurrent->kunit_test = test;
\tkunit_run_case_internal(test, suite, test_case);
}
#ifdef CONFIG_MODULES
static void kunit_module_init(struct module *mod)
{
\t__kunit_test_suites_init(mod->kunit_suites, mod->num_kunit_suites);
}
#endif
void kunit_cleanup(struct kunit *test)
{
\tcurrent->kunit_test = NULL;
}
static int __init kunit_init(void)
{
#ifdef CONFIG_MODULES
\treturn register_module_notifier(&kunit_mod_nb);
#else
\treturn 0;
#endif
}
static void __exit kunit_exit(void)
{
#ifdef CONFIG_MODULES
\tunregister_module_notifier(&kunit_mod_nb);
#endif
}
"""


def test_the_members_a_kunit_less_kernel_lacks_are_not_used(tmp_path: Path) -> None:
    (tmp_path / "test.c").write_text(TEST_C)
    kunitbuild.adapt(tmp_path, "linux-source-6.1 test")
    text = (tmp_path / "test.c").read_text()
    assert "kunit_test =" not in text
    assert "#ifdef CONFIG_MODULES" not in text
    assert text.count("#if 0 /* obmm-testbed:") == 3
    assert "kunit_run_case_internal(test, suite, test_case);" in text


def test_a_changed_source_stops_the_build_naming_the_change(tmp_path: Path) -> None:
    (tmp_path / "test.c").write_text(TEST_C.replace("\tcurrent->kunit_test = NULL;\n", ""))
    with pytest.raises(kunitbuild.KunitBuildError, match=r"test\.c: .* matched 1 times, not 2"):
        kunitbuild.adapt(tmp_path, "linux-source-6.1 9.9")


def test_the_source_package_follows_the_kernel() -> None:
    assert kunitbuild.source_package("6.1.0-57-amd64") == "linux-source-6.1"
    with pytest.raises(kunitbuild.KunitBuildError):
        kunitbuild.source_package("vmlinuz")
