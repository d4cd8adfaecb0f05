import socket

import pytest

from coevo.cli import main


def test_it_refuses_to_start_the_demo_on_a_port_in_use(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        assert main(["demo", "--once", "--port", str(port)]) == 1

    err = capsys.readouterr().err
    assert f"Port {port} on 127.0.0.1 is not free" in err
    assert "--port" in err


def test_it_rejects_a_demo_with_no_tasks(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--tasks", "0"])

    assert exit_info.value.code == 2
    assert "--tasks must be at least 1" in capsys.readouterr().err
