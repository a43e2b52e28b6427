#!/usr/bin/env python3
"""Writes scikit-learn's 8x8 digits (1797 images, labels 0-9; UCI optdigits test set) as the
plain text file samples/digits_cnn.c reads, so that the C sample needs no Python at run time:

    digits 1797 64            (a header: magic word, image count, pixels per image)
    LABEL P0 P1 ... P63       (one line per image; pixels are integers 0..16, row-major)

Usage: /usr/bin/python3 tools/dump_digits.py OUT (Debian's python3-sklearn; the build runs it
when sklearn imports, see samples/meson.build). The data ship inside sklearn: no download."""
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: dump_digits.py OUT')
    from sklearn.datasets import load_digits

    d = load_digits()
    images, labels = d.data.astype(int), d.target.astype(int)
    n, p = images.shape
    if p != 64 or n != len(labels) or images.min() < 0 or images.max() > 16:
        sys.exit('dump_digits.py: unexpected digits data: %s images of %d pixels' % (n, p))
    out = sys.argv[1]
    tmp = out + '.tmp'
    with open(tmp, 'w') as f:
        f.write('digits %d %d\n' % (n, p))
        for label, row in zip(labels, images):
            f.write('%d %s\n' % (label, ' '.join(str(v) for v in row)))
    os.replace(tmp, out)  # never leave a half-written file under the final name


if __name__ == '__main__':
    main()
