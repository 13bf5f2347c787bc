import redis

from service.embedded_redis import EmbeddedRedis


def test_embedded_redis_is_a_real_server_and_stops_cleanly():
    server = EmbeddedRedis()
    url = server.start()
    client = redis.Redis.from_url(url)
    assert client.ping()
    assert client.info("server")["redis_version"]
    client.set("k", b"v", ex=10)
    assert client.get("k") == b"v"
    client.close()
    process = server._process
    server.stop()
    assert process is not None and process.poll() is not None, "redis-server still running after stop()"
    assert not server.folder.exists()
