"""Start a single-node ZooKeeper + Kafka cluster from the project's kafka image.

Plain clusters open both listeners without TLS or logins (KAFKA_EXTERNAL_PLAINTEXT=1 and
KAFKA_INTERNAL_PLAINTEXT=1: tests on one machine only). A secure one is set up as the stacks set up a
site: a throw-away CA and a broker certificate naming 127.0.0.1 (the host's address of it), a clients CA
and the operator's and the relay's client certificates, EXTERNAL SASL_SSL with mutual TLS, BROKER (the
brokers' own, mutual TLS with a brokers CA), SERVICES (SASL_SSL, the BROKER certificate) and INTERNAL
SASL_PLAINTEXT with SCRAM-SHA-512 and the ACL authorizer; the broker's own
principal and the admin's, which the broker writes into ZooKeeper as it starts; and the operator's
SCRAM user. All three are super users. With `zookeeper_tls`, ZooKeeper as a stack runs it: clients over TLS
only (2182, a ZooKeeper CA), and only with the brokers' login."""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from services.common import kafka_auth
from tooling.testbed import certs
from tooling.testbed.docker_lab import Lab, free_port, image, wait_until

# MirrorMaker's replication factors on the single-broker test clusters (mm2.properties lines).
MM2_SINGLE_BROKER = "\n".join(f"{key} = 1" for key in (
    "replication.factor", "checkpoints.topic.replication.factor", "heartbeats.topic.replication.factor",
    "offset-syncs.topic.replication.factor", "offset.storage.replication.factor",
    "status.storage.replication.factor", "config.storage.replication.factor"))

@dataclass(frozen=True)
class KafkaCluster:
    zookeeper: str   # container name of the ZooKeeper node
    broker: str      # container name of the broker
    internal: str    # bootstrap for containers on the lab network
    external: str    # bootstrap for the host (127.0.0.1:<port>)
    ca_file: str = ""                                      # secure clusters: the CA the broker's certificate chains to
    operator: tuple[str, str] = field(default=("", ""))    # secure clusters: the super user's name and password
    admin: tuple[str, str] = field(default=("", ""))       # secure clusters: the admin tools' login on INTERNAL
    pki: str = ""                                          # secure clusters: make_pki's directory
    services_host: str = ""                                # services_on_host: SERVICES' bootstrap on the host

    @property
    def services(self) -> str:
        """Secure clusters: the bootstrap of SERVICES (SCRAM inside TLS, the brokers CA) for containers."""
        return f"{self.broker}:9095"

    def client_cert(self, name: str = "operator") -> tuple[str, str]:
        """(certificate, key) files of a client certificate make_pki issued (operator, relay)."""
        return f"{self.pki}/{name}.crt", f"{self.pki}/{name}.key"

    def login(self, user: str, password: str, cert: str = "operator") -> dict[str, str]:
        """EXTERNAL settings of a SCRAM login with the client certificate `cert`."""
        return kafka_auth.sasl_ssl_config(user, password, self.ca_file, *self.client_cert(cert))

    def client(self, **config: object) -> dict:
        """Settings of a host client of EXTERNAL (as the operator on a secure cluster)."""
        security = self.login(*self.operator) if self.ca_file else {}
        return {"bootstrap.servers": self.external, **config, **security}


def make_pki(directory: Path, broker: str) -> Path:
    """As the pki role writes them, in `directory`: a CA and the broker's key and certificate (SAN 127.0.0.1
    and its container name): ca.crt, keystore.pem (PKCS#8 key, certificate, CA); a clients CA (clients-ca.crt)
    and client certificates from it for the operator and the relay (<name>.crt, <name>.key, and
    <name>-keystore.pem for Java clients); other.crt/other.key, a client certificate of the broker's CA (not
    the clients CA); a brokers CA (brokers-ca.crt) and the broker's BROKER certificate from it, CN kafka-broker
    (broker-keystore.pem). Returns the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    pem = serialization.Encoding.PEM
    ca, clients_ca = certs.ca("iot-stack test CA"), certs.ca("iot-stack test clients CA")
    brokers_ca = certs.ca("iot-stack test brokers CA")
    key, cert = certs.issue(ca, broker, ExtendedKeyUsageOID.SERVER_AUTH,
                       (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(broker)))
    broker_key, broker_cert = certs.issue(brokers_ca, "kafka-broker",
                                     (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
                                     (x509.DNSName(broker), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))))
    ca_pem, clients_ca_pem = ca[1].public_bytes(pem), clients_ca[1].public_bytes(pem)
    brokers_ca_pem = brokers_ca[1].public_bytes(pem)
    files = {"ca.crt": ca_pem, "clients-ca.crt": clients_ca_pem, "brokers-ca.crt": brokers_ca_pem,
             "keystore.pem": certs.key_pem(key) + cert.public_bytes(pem) + ca_pem,
             "broker-keystore.pem": certs.key_pem(broker_key) + broker_cert.public_bytes(pem) + brokers_ca_pem}
    for name, issuer in (("operator", clients_ca), ("relay", clients_ca), ("other", ca)):
        client_key, client_cert = certs.issue(issuer, name, ExtendedKeyUsageOID.CLIENT_AUTH)
        files |= {f"{name}.crt": client_cert.public_bytes(pem), f"{name}.key": certs.key_pem(client_key),
                  f"{name}-keystore.pem": certs.key_pem(client_key) + client_cert.public_bytes(pem)}
    directory.chmod(0o755)
    for name, content in files.items():
        (directory / name).write_bytes(content)
        (directory / name).chmod(0o644)    # the container's uid 1000 reads them
    return directory / "ca.crt"


# Run with `python -c PORT_PROBE PORTS HOST...` in a container on the network under test: one line per host and
# port, "<host> <port> open" or "<host> <port> <the error's name>" (ConnectionRefusedError: nothing listens).
PORT_PROBE = """
import socket, sys
for host in sys.argv[2:]:
    for port in sys.argv[1].split(","):
        try:
            socket.create_connection((host, int(port)), timeout=10).close(); print(host, port, "open")
        except OSError as err:
            print(host, port, type(err).__name__)
"""


def port_states(output: str) -> dict[tuple[str, int], str]:
    """PORT_PROBE's lines as {(host, port): state}."""
    return {(host, int(port)): state for host, port, state in (line.split() for line in output.splitlines())}


def zookeeper_tls_client(ca: str) -> list[str]:
    """A ZooKeeper client's JVM flags over TLS, checking the server against `ca` (a file in its container), as
    the kafka image's zookeeper_tls_opts gives its tools; with no login (tests of who is refused)."""
    return ["-Dzookeeper.client.secure=true", "-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty",
            f"-Dzookeeper.ssl.trustStore.location={ca}", "-Dzookeeper.ssl.trustStore.type=PEM",
            "-cp", "/opt/kafka/libs/*", "org.apache.zookeeper.ZooKeeperMain"]


def make_zookeeper_pki(directory: Path, zookeeper: str) -> None:
    """As the pki role's tasks/zookeeper.yml writes them: a ZooKeeper CA (zookeeper-ca.crt) and the server's key
    and certificate from it (zookeeper-keystore.pem), naming `zookeeper` and zookeeper-1 (a stack's name of
    server 1, which the health role's probe dials)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    pem = serialization.Encoding.PEM
    zookeeper_ca = certs.ca("iot-stack test zookeeper CA")
    key, cert = certs.issue(zookeeper_ca, zookeeper, (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
                            (x509.DNSName(zookeeper), x509.DNSName("zookeeper-1")))
    ca_pem = zookeeper_ca[1].public_bytes(pem)
    for name, content in (("zookeeper-ca.crt", ca_pem),
                          ("zookeeper-keystore.pem", certs.key_pem(key) + cert.public_bytes(pem) + ca_pem)):
        (directory / name).write_bytes(content)
        (directory / name).chmod(0o644)    # the container's uid 1000 reads them


def start_kafka_cluster(lab: Lab, prefix: str = "", operator: tuple[str, str] | None = None,
                        zookeeper_env: dict[str, str] | None = None, broker_env: dict[str, str] | None = None,
                        broker_memory: str = "1g", services_on_host: bool = False,
                        internal: bool = True, zookeeper_tls: bool = False) -> KafkaCluster:
    """One ZooKeeper and one broker named '<prefix>zookeeper' and '<prefix>kafka'; with `operator`
    (user, password) EXTERNAL is secured as at a site and that user is its super user. `zookeeper_env` and
    `broker_env` add to each one's environment (a site's heaps and JVM options: tooling.testbed.pipeline).
    `services_on_host` (secure clusters, benchmarks): SERVICES is published and advertised on 127.0.0.1, so
    that a client on the host takes the services' path, TLS with the brokers CA, as deployed. `internal`
    false (secure clusters): the listeners a stack opens, INTERNAL closed (cluster.internal is then '').
    `zookeeper_tls` (secure clusters): ZooKeeper's clients over TLS only and with the login, as in a stack."""
    zk, broker = f"{prefix}zookeeper", f"{prefix}kafka"
    port = free_port()
    services_port = free_port() if services_on_host else 0
    pki = Path(tempfile.mkdtemp(prefix="kafka-pki-")) if operator else None
    if pki:
        # The site's ZooKeeper password: ZooKeeper knows it, the broker logs in with it (zookeeper_jaas).
        pki.chmod(0o755)
        (pki / "zookeeper.password").write_text(f"zookeeper-{uuid.uuid4().hex}\n")
        (pki / "zookeeper.password").chmod(0o644)    # the container's uid 1000 reads it
        tls = {}
        if zookeeper_tls:                   # as ansible/roles/stack/templates/stack-services.j2 sets them
            make_zookeeper_pki(pki, zk)
            tls = {"ZOO_TLS_KEYSTORE_FILE": "/etc/kafka-pki/zookeeper-keystore.pem", "ZOO_CLIENT_TLS": "required"}
        lab.run("kafka", zk, "zookeeper", memory="512m", volumes={str(pki): "/etc/kafka-pki:ro"},
                env={"ZOO_KAFKA_PASSWORD_FILE": "/etc/kafka-pki/zookeeper.password", **tls, **(zookeeper_env or {})})
    else:
        lab.run("kafka", zk, "zookeeper", memory="512m", env=zookeeper_env)
    env = {
        "KAFKA_BROKER_ID": "1",
        "KAFKA_ZOOKEEPER_CONNECT": f"{zk}:2181",
        "KAFKA_ADVERTISED_LISTENERS": f"INTERNAL://{broker}:9092,EXTERNAL://127.0.0.1:{port}"
                                      + (f",BROKER://{broker}:9093,SERVICES://"
                                         + (f"127.0.0.1:{services_port}" if services_port else f"{broker}:9095")
                                         if operator else ""),
        # A single broker cannot hold three replicas of the internal topics.
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
    if operator and not internal:          # as ansible/roles/stack/templates/stack-services.j2 sets them
        env["KAFKA_ADVERTISED_LISTENERS"] = env["KAFKA_ADVERTISED_LISTENERS"].replace(f"INTERNAL://{broker}:9092,", "")
        env |= {"KAFKA_LISTENERS": "BROKER://0.0.0.0:9093,EXTERNAL://0.0.0.0:9094,SERVICES://0.0.0.0:9095",
                "KAFKA_HEALTH_PORT": "9095"}
    volumes, ca_file, admin = {}, "", ("", "")
    if pki:
        ca_file = str(make_pki(pki, broker))
        admin = ("admin", f"admin-{uuid.uuid4().hex}")
        broker_password = f"broker-{uuid.uuid4().hex}"
        broker_jaas = kafka_auth.properties_value(kafka_auth.jaas_config("broker", broker_password))
        for name, text in (("broker.password", broker_password), ("admin.password", admin[1]),
                           ("broker.jaas", broker_jaas)):
            (pki / name).write_text(text + "\n")
            (pki / name).chmod(0o644)    # the container's uid 1000 reads them
        volumes = {str(pki): "/etc/kafka-pki:ro"}
        env |= {"KAFKA_EXTERNAL_KEYSTORE_FILE": "/etc/kafka-pki/keystore.pem",
                "KAFKA_EXTERNAL_CLIENT_CA_FILE": "/etc/kafka-pki/clients-ca.crt", "KAFKA_OPERATOR_USER": operator[0],
                "KAFKA_INTERNAL_USER": "broker", "KAFKA_INTERNAL_PASSWORD_FILE": "/etc/kafka-pki/broker.password",
                "KAFKA_INTERNAL_JAAS_FILE": "/etc/kafka-pki/broker.jaas",
                "KAFKA_ADMIN_USER": admin[0], "KAFKA_ADMIN_PASSWORD_FILE": "/etc/kafka-pki/admin.password",
                "KAFKA_ZOOKEEPER_PASSWORD_FILE": "/etc/kafka-pki/zookeeper.password",
                "KAFKA_BROKER_KEYSTORE_FILE": "/etc/kafka-pki/broker-keystore.pem",
                "KAFKA_BROKER_CA_FILE": "/etc/kafka-pki/brokers-ca.crt"}
        if zookeeper_tls:
            env |= {"KAFKA_ZOOKEEPER_CONNECT": f"{zk}:2182",
                    "KAFKA_ZOOKEEPER_CA_FILE": "/etc/kafka-pki/zookeeper-ca.crt"}
            _add_scram_user(lab, zk, *operator, login=pki)
        else:
            _add_scram_user(lab, zk, *operator)     # without the ZooKeeper login: an open znode, as on an old site
    else:
        env |= {"KAFKA_EXTERNAL_PLAINTEXT": "1", "KAFKA_INTERNAL_PLAINTEXT": "1"}
    ports = {port: 9094} | ({services_port: 9095} if services_port else {})
    lab.run("kafka", broker, "kafka", memory=broker_memory, ports=ports, env=env | (broker_env or {}),
            volumes=volumes)
    cluster = KafkaCluster(zk, broker, f"{broker}:9092" if internal else "", f"127.0.0.1:{port}", ca_file,
                           operator or ("", ""), admin,
                           str(pki or ""), f"127.0.0.1:{services_port}" if services_port else "")

    def broker_registered() -> bool:
        metadata = AdminClient(cluster.client()).list_topics(timeout=5)
        return len(metadata.brokers) == 1

    wait_until(f"kafka broker {broker}", broker_registered, timeout=180,
               on_timeout=lambda: lab.logs(zk) + lab.logs(broker))
    if pki:
        secure_zookeeper(lab, cluster)
    return cluster


def secure_zookeeper(lab: Lab, cluster: KafkaCluster) -> str:
    """`secure-zookeeper` (the kafka image's entrypoint) in the broker's container, as the stack role runs it
    once per site: every existing znode locked to the brokers' ZooKeeper login. Returns its output."""
    result = lab.exec(cluster.broker, "/opt/kafka/bin/entrypoint", "secure-zookeeper")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _add_scram_user(lab: Lab, zk: str, user: str, password: str, login: Path | None = None) -> None:
    """The operator's SCRAM credential, written into ZooKeeper before the broker starts (the stacks
    use iot-kafka-access over SERVICES instead; a test's password may sit on a command line). With `login` (the
    pki directory), logged in to ZooKeeper as the brokers are, which a server refusing sessions without it needs;
    from inside its container, on the loopback's client port in clear."""
    command = ["kafka-configs"]
    if login:
        jaas = login / "zookeeper-client.jaas"
        password_text = (login / "zookeeper.password").read_text().strip()
        jaas.write_text('Client {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n'
                        f'  username="kafka"\n  password="{password_text}";\n}};\n')
        jaas.chmod(0o644)
        command = ["java", "-Djava.security.auth.login.config=/etc/kafka-pki/zookeeper-client.jaas",
                   "-Dlog4j.configuration=file:/opt/kafka/config/tools-log4j.properties", "-cp", "/opt/kafka/libs/*",
                   "kafka.admin.ConfigCommand"]

    def added() -> bool:
        result = lab.exec(zk, *command, "--zookeeper", "localhost:2181", "--alter", "--add-config",
                          f"SCRAM-SHA-512=[password={password}]", "--entity-type", "users", "--entity-name", user)
        return result.returncode == 0

    wait_until(f"SCRAM user {user} in {zk}", added, timeout=120, interval=2, on_timeout=lambda: lab.logs(zk))


# A service's Kafka login as a stack gives it: user, password file, brokers CA (kafka_auth reads them).
LOGIN_VARIABLES = (kafka_auth.USERNAME_ENV, f"{kafka_auth.PASSWORD_SECRET.upper()}_FILE", kafka_auth.CA_FILE.env)


def services_login(cluster: KafkaCluster) -> dict[str, str]:
    """KAFKA_* variables of the super user's login on a secure cluster's SERVICES, as the stack gives a
    service (KAFKA_USERNAME, KAFKA_PASSWORD_FILE, KAFKA_CA_FILE = the brokers CA): for login_environment."""
    password = Path(cluster.pki) / "operator.password"
    password.write_text(cluster.operator[1] + "\n")
    values = (cluster.operator[0], str(password), f"{cluster.pki}/brokers-ca.crt")
    return dict(zip(LOGIN_VARIABLES, values, strict=True))


@contextlib.contextmanager
def login_environment(variables: dict[str, str]):
    """This process's environment holds exactly `variables` of the service's Kafka login while a service
    built in it reads them (kafka_auth.internal_config); {} for none, a plaintext cluster."""
    saved = {key: os.environ.pop(key, None) for key in LOGIN_VARIABLES}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def create_topics(cluster: KafkaCluster, *names: str, partitions: int = 3, config: dict | None = None) -> None:
    admin = AdminClient(cluster.client())
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {})
                                   for n in names])
    for future in futures.values():
        future.result(timeout=60)


def ensure_access(lab: Lab, cluster: KafkaCluster, users: dict[str, str], acls: list[dict], *extra: str) -> dict:
    """`iot-kafka-access ensure` as the stack role runs it: a throwaway services container on the
    brokers' network (INTERNAL), logged in as the admin on a secure cluster, passwords on stdin.
    Returns its JSON line."""
    login = ["--login", cluster.admin[0]] if cluster.admin[0] else []
    users = {**users, **dict([cluster.admin])} if cluster.admin[0] else users
    cmd = ["docker", "run", "-i", "--rm", "--network", lab.network, image("services"), "iot-kafka-access", "ensure",
           "--bootstrap", cluster.internal, "--acls", json.dumps(acls), "--wait-seconds", "120", *login, *extra]
    result = subprocess.run(cmd, input=json.dumps(users), capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or len(result.stdout.splitlines()) != 1:
        raise RuntimeError(f"iot-kafka-access failed ({result.returncode}): {result.stdout}{result.stderr}")
    return json.loads(result.stdout)


def metadata_errors(config: dict, seconds: float = 10) -> list[KafkaError]:
    """The errors a client with `config` meets asking for metadata; [] when it gets it (a refused
    login shows as _AUTHENTICATION, an untrusted certificate as _SSL)."""
    errors: list[KafkaError] = []
    admin = AdminClient({**config, "error_cb": errors.append, "socket.timeout.ms": 5000})
    try:
        admin.list_topics(timeout=seconds)
    except KafkaException as err:
        admin.poll(1)    # serves error_cb, which carries the reason
        return [*errors, err.args[0]]
    return []


# A client of a site's INTERNAL listener, run in a throwaway services container on the brokers' network;
# its login comes on stdin. It prints {"topics": [...] or null, "errors": [...], "write <topic>": outcome}.
INTERNAL_PROBE = r"""
import json, sys
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
args = json.load(sys.stdin)
conf = {"bootstrap.servers": args["bootstrap"], "socket.timeout.ms": 5000}
if args["user"]:
    conf |= {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
             "sasl.username": args["user"], "sasl.password": args["password"]}
conf |= args.get("conf", {})
errors, out = [], {}
admin = AdminClient({**conf, "error_cb": lambda e: errors.append(e.name())})
try:
    out["topics"] = sorted(admin.list_topics(timeout=10).topics)
except Exception:
    out["topics"] = None
    admin.poll(1)    # serves error_cb, which carries the reason
out["errors"] = sorted(set(errors))
for topic in args["write"]:
    results = []
    producer = Producer({**conf, "message.timeout.ms": 10000})
    producer.produce(topic, b"x", on_delivery=lambda err, msg: results.append(err.name() if err else "ok"))
    producer.flush(15)
    out["write " + topic] = results[0] if results else "none"
print(json.dumps(out))
"""


def probe_internal(network: str, bootstrap: str, user: str = "", password: str = "", write: tuple[str, ...] = (),
                   via: tuple[str, ...] = (), conf: dict | None = None, volumes: dict[str, str] | None = None) -> dict:
    """What a client with this login (none: anonymous) gets on INTERNAL (or whatever `bootstrap` names):
    metadata, errors, and the outcome of writing one record to each of `write`. `conf`: more client settings
    (TLS files under `volumes`, host path -> container path). `via`: a command prefix that runs docker
    elsewhere (a lab host: docker exec -i <host>)."""
    mounts = [arg for src, dst in (volumes or {}).items() for arg in ("-v", f"{src}:{dst}:ro")]
    cmd = [*via, "docker", "run", "-i", "--rm", "--network", network, *mounts, image("services"), "python", "-c",
           INTERNAL_PROBE]
    stdin = json.dumps({"bootstrap": bootstrap, "user": user, "password": password, "write": list(write),
                        "conf": conf or {}})
    result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"INTERNAL probe failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)
