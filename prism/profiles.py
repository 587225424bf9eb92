"""`prism profiles install [--site]`: puts prism's Snakemake profiles where Snakemake looks for them.

Snakemake resolves `--profile NAME` in the current folder, then the user's config folder (`~/.config/snakemake`),
then the site's (`/etc/xdg/snakemake`); not in the checkout's `profiles/`. Installing copies each profile there,
so `snakemake --profile slurm` works as users type it. A different profile already installed under the same
name is left alone unless --force.
"""

from __future__ import annotations

import argparse
import errno
import filecmp
import shutil
import sys
from pathlib import Path

# the checkout's profiles/ (prism is installed editable from its checkout: make setup)
SOURCE = Path(__file__).resolve().parent.parent / "profiles"


class ProfileError(Exception):
    pass


def available(source: Path = SOURCE) -> dict[str, Path]:
    """Profile name -> folder, for every profile prism ships (a folder holding config.yaml)."""
    if not source.is_dir():
        raise ProfileError(f"no profiles folder at {source}: install prism from its checkout (make setup)")
    return {p.name: p for p in sorted(source.iterdir()) if (p / "config.yaml").is_file()}


def target_dir(site: bool = False) -> Path:
    """The folder Snakemake searches: the user's config folder, or with site=True the machine's."""
    from snakemake.common import get_appdirs  # the very folders Snakemake's --profile lookup uses

    dirs = get_appdirs()
    return Path(dirs.site_config_dir if site else dirs.user_config_dir)


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def install(site: bool = False, force: bool = False, names: list[str] | None = None,
            dest: Path | None = None) -> list[Path]:
    """Copies the named profiles (all by default) into dest (default: target_dir(site)); returns their folders."""
    profiles = available()
    names = names or list(profiles)
    unknown = [n for n in names if n not in profiles]
    if unknown:
        raise ProfileError(f"unknown profile(s) {', '.join(unknown)}: prism ships {', '.join(profiles)}")
    dest = dest or target_dir(site)
    # every refusal before any copy: a run installs all it was asked for, or nothing
    refused = [dest / n for n in names if (dest / n).exists() and not _same_profile(profiles[n], dest / n)]
    if refused and not force:
        rest = [n for n in names if dest / n not in refused]
        raise ProfileError(f"{', '.join(map(str, refused))} exist{'s' if len(refused) == 1 else ''} and differ"
                           f"{'s' if len(refused) == 1 else ''} from prism's profile{'s' if len(refused) > 1 else ''}"
                           f" of that name: keep {'it' if len(refused) == 1 else 'them'}, or replace with `prism "
                           f"profiles install --force`; nothing installed"
                           + (f" (also asked for: {', '.join(rest)})" if rest else ""))
    installed = []
    for name in names:
        src, dst = profiles[name], dest / name
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            elif dst.exists() or dst.is_symlink():
                dst.unlink()  # a file (or link) where the profile's folder goes, replaced with --force
            tmp.rename(dst)
        except OSError as e:
            where = Path(e.filename) if e.filename else dst
            fix = ("a file stands where a folder must be: move it away"
                   if e.errno in (errno.EEXIST, errno.ENOTDIR) else "run as root for --site" if site else
                   "make it writable, or point XDG_CONFIG_HOME at a writable folder")
            raise ProfileError(f"cannot write {dst}: {where}: {e.strerror}; {fix}") from None
        installed.append(dst)
    return installed


def _same_profile(src: Path, dst: Path) -> bool:
    return dst.is_dir() and not dst.is_symlink() and _same_tree(src, dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism profiles", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    inst = sub.add_parser("install", help="copy prism's profiles (local, slurm) where `snakemake --profile` finds them")
    inst.add_argument("names", nargs="*", help="profiles to install (default: all)")
    inst.add_argument("--site", action="store_true", help="for every user of this machine (/etc/xdg/snakemake)")
    inst.add_argument("--force", action="store_true", help="replace a different profile of the same name")
    sub.add_parser("list", help="the profiles prism ships and where they would be installed")
    args = parser.parse_args(argv)
    try:
        if args.action == "list":
            for name, path in available().items():
                print(f"{name:<8} {path}")
            print(f"install to: {target_dir(False)} (user), {target_dir(True)} (--site)")
            return 0
        for path in install(site=args.site, force=args.force, names=args.names):
            print(f"installed {path}: snakemake --profile {path.name}")
    except ProfileError as e:
        print(f"prism profiles: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
