"""Split an image-folder dataset into two halves of symbolic links: every second image of each class.

    python benchmarks/split_halves.py                       # ../shared/data/cifar10-test -> runs/figures/halves/{a,b}
    python benchmarks/split_halves.py --source DIR --out DIR
    python benchmarks/split_halves.py --source ../shared/data/imagenet-sample-500 --out DIR --by-class
    python benchmarks/split_halves.py --source DIR --out DIR --flat     # half a also as one folder without labels

Per class folder, the files in sorted name order at even positions (0, 2, 4, ...) go to ``OUT/a``, those
at odd positions to ``OUT/b``, as links to the source files (nothing is copied). For CIFAR-10's test split
(1,000 JPEGs per class) each half holds 500 images per class. The README's "Measured" figures give a run
half ``a`` as its dataset and evaluate the models it saved on half ``b``, images the run never saw.

``--by-class``: a dataset of one image per class (the ImageNet sample) is split by class instead, the sorted class
folders at even positions to ``a``, odd ones to ``b``. ``--flat``: ``OUT/a-flat`` holds half ``a``'s images in one
folder without class sub-folders (an unlabelled dataset: the runs' label-free mode), named ``<class>__<file>``.

Re-running with the same arguments checks the links and adds those missing; a link that points elsewhere,
or a file that is not one of the source's, stops the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from figure_common import REPO, SHARED, fail

HALVES = ("a", "b")


def class_folders(source: Path) -> list[Path]:
    folders = sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise fail(f"{source} holds no class folders: pass an image folder (one sub-folder per class)")
    return folders


def halves_of(folder: Path) -> dict[str, list[Path]]:
    """The files of one class folder, sorted by name: even positions in ``a``, odd positions in ``b``."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    return {"a": files[0::2], "b": files[1::2]}


def link_half(files: list[Path], target: Path) -> int:
    """Link ``files`` into ``target``; returns the links made (those already right are kept)."""
    target.mkdir(parents=True, exist_ok=True)
    wanted = {f.name: f.resolve() for f in files}
    extra = sorted(p.name for p in target.iterdir() if p.name not in wanted)
    if extra:
        raise fail(
            f"{target} holds {len(extra)} file(s) of no half, e.g. {extra[0]}: remove it or choose another --out"
        )
    made = 0
    for name, source in wanted.items():
        link = target / name
        if link.is_symlink():
            if link.resolve() != source:
                raise fail(
                    f"{link} points to {link.resolve()}, not {source}: remove {target.parent} or choose another --out"
                )
            continue
        if link.exists():
            raise fail(f"{link} is a file, not a link to {source}: remove it or choose another --out")
        link.symlink_to(source)
        made += 1
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=SHARED / "data" / "cifar10-test", help="image folder to split")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "figures" / "halves", help="writes OUT/a and OUT/b")
    parser.add_argument("--by-class", action="store_true", help="split the class folders, not each one's images")
    parser.add_argument("--flat", action="store_true", help="also OUT/a-flat: half a without class folders")
    args = parser.parse_args(argv)
    source: Path = args.source.resolve()
    if not source.is_dir():
        raise fail(f"{source} is not a folder: pass --source, an image folder with one sub-folder per class")
    counts = {half: 0 for half in HALVES}
    made = 0
    folders = class_folders(source)
    flat: list[Path] = []
    for position, folder in enumerate(folders):
        files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        split = {HALVES[position % 2]: files} if args.by_class else halves_of(folder)
        for half, chosen in split.items():
            made += link_half(chosen, args.out / half / folder.name)
            counts[half] += len(chosen)
            flat += [f for f in chosen if half == "a"]
    if args.flat:
        target = args.out / "a-flat"
        target.mkdir(parents=True, exist_ok=True)
        for file in flat:
            link = target / f"{file.parent.name}__{file.name}"
            if not link.is_symlink():
                link.symlink_to(file.resolve())
    how = "every second class folder" if args.by_class else "every second image per class"
    print(
        f"{args.out}/a: {counts['a']} images, {args.out}/b: {counts['b']} images ({how} of {source}; {made} links made)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
