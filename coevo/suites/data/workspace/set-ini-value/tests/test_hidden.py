import configparser


def test_ini():
    cp = configparser.ConfigParser()
    assert cp.read("/app/app.ini") == ["/app/app.ini"]
    assert cp.sections() == ["server", "database"]
    assert cp["database"]["host"] == "db.internal"
    assert cp["database"]["port"] == "5432"
    assert cp["database"]["name"] == "shop"
    assert dict(cp["server"]) == {"host": "localhost", "port": "8000"}
    assert set(cp["database"]) == {"host", "port", "name"}
