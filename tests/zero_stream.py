"""A stream of zero bytes for tarfile.addfile: archives that declare huge members without holding them in memory."""


class Zeros:
    """A file of ``size`` zero bytes that is never in memory whole (for tarfile.addfile)."""

    def __init__(self, size: int):
        self.left = size

    def read(self, size: int = -1) -> bytes:
        n = self.left if size < 0 else min(size, self.left)
        self.left -= n
        return bytes(n)
