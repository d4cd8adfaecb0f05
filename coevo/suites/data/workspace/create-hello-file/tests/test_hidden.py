from pathlib import Path


def test_hello_file():
    p = Path("/app/hello.txt")
    assert p.is_file()
    assert p.read_bytes() in (b"hello world", b"hello world\n")
