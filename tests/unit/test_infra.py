"""``infra/`` (Bicep, parameters file) and ``azure.yaml`` checked against what the code reads.

No Bicep CLI and no Azure here (SPEC §8): ``pycep-parser`` parses ``infra/*.bicep`` into JSON
(comments dropped, expressions as trees) and the checks below read that. The app settings the app
needs are not listed by hand: they are the ``%NAME%`` placeholders of the repository's
``function_app.py``, plus what :func:`azure_functions_db.state._azure.resolve_storage` — the code
the state stores use — makes of the Bicep's own storage settings.

Every check is a function of an :class:`Infra`. ``test_mutant_is_caught`` applies small edits to
the real files (add ``listKeys()``, turn shared keys back on, point a role at the wrong scope, …)
and asserts that the matching check fails, so no check can quietly pass everything.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from pycep import BicepParser

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources.urls import PLACEHOLDER
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.storage import DEFAULT_CONNECTION, resolve_storage

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"
PARAMETERS = INFRA / "main.parameters.json"
AZURE_YAML = ROOT / "azure.yaml"
FUNCTION_APP = ROOT / "function_app.py"

#: Built-in role definition IDs (Microsoft Learn, "Azure built-in roles"): the same in every
#: tenant. Each must be assigned exactly once to the app's identity, at a resource of this type.
ROLES: dict[str, tuple[str, str]] = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": (
        "Storage Blob Data Owner",
        "Microsoft.Storage/storageAccounts",
    ),
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": (
        "Storage Queue Data Contributor",
        "Microsoft.Storage/storageAccounts",
    ),
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": (
        "Storage Table Data Contributor",
        "Microsoft.Storage/storageAccounts",
    ),
    "4633458b-17de-408a-b874-0445c86b69e6": ("Key Vault Secrets User", "Microsoft.KeyVault/vaults"),
    "3913510d-42f4-4e42-8a64-420c390055eb": (
        "Monitoring Metrics Publisher",
        "Microsoft.Insights/components",
    ),
}

#: Python versions a Flex Consumption app can run (Microsoft Learn, "Flex Consumption plan
#: hosting", supported language stack versions).
FLEX_PYTHON = ("3.10", "3.11", "3.12")

#: App settings a Flex Consumption app must not have: the platform takes the runtime, scale and
#: deployment source from ``functionAppConfig``, and these either fail the deployment or are
#: ignored. ``AzureWebJobsStorage`` itself would be read as a connection string by the host and by
#: the state stores, overriding the identity-based ``__`` settings.
FORBIDDEN_SETTINGS = frozenset(
    {
        "AzureWebJobsStorage",
        "AzureWebJobsDashboard",
        "FUNCTIONS_EXTENSION_VERSION",
        "FUNCTIONS_WORKER_RUNTIME",
        "FUNCTIONS_WORKER_RUNTIME_VERSION",
        "WEBSITE_RUN_FROM_PACKAGE",
        "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
        "WEBSITE_CONTENTSHARE",
        "SCM_DO_BUILD_DURING_DEPLOYMENT",
        "ENABLE_ORYX_BUILD",
    }
)

#: Outputs azd writes to ``.azure/<env>/.env`` and docs/deploy.md uses, with the resource type
#: whose name (or the expression) each must be.
OUTPUTS = {
    "AZURE_FUNCTION_APP_NAME": "Microsoft.Web/sites",
    "AZURE_STORAGE_ACCOUNT_NAME": "Microsoft.Storage/storageAccounts",
    "AZURE_KEY_VAULT_NAME": "Microsoft.KeyVault/vaults",
    "AZURE_APP_IDENTITY_NAME": "Microsoft.ManagedIdentity/userAssignedIdentities",
    "APPLICATIONINSIGHTS_NAME": "Microsoft.Insights/components",
}

# Values that stand in for ARM expressions when the storage settings are fed to the real code.
SIM_CLIENT_ID = "11111111-2222-3333-4444-555555555555"
SIM_ENDPOINT = "https://stsimulated.{service}.core.windows.net/"

_PARSER = BicepParser()


# -- Reading the Bicep ----------------------------------------------------------------------------


def expr(node: Any) -> str:
    """A pycep expression as Bicep-like text: ``storage.properties.primaryEndpoints.blob``,
    ``resource_group().name``; a plain string as itself."""
    if isinstance(node, dict):
        if "operator" in node:
            op = node["operator"]
            operands = op["operands"]
            if op["type"] == "property_accessor":
                return f"{expr(operands['operand_1'])}.{expr(operands['operand_2'])}"
            if op["type"] == "function_accessor":
                return f"{expr(operands['operand_1'])}.{operands['func_name']}()"
            if op["type"] == "index_accessor":
                return f"{expr(operands['operand_1'])}[{expr(operands['operand_2'])}]"
            return f"<{op['type']}>"
        if "function" in node:
            return f"{node['function']['type']}()"
    return str(node)


@dataclass
class Infra:
    """The parsed infra files (and the sample app's source, when there is one)."""

    template: dict[str, Any]
    parameters_file: dict[str, Any]
    azure_yaml: dict[str, Any]
    app_source: str | None
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)

    # resources ----------------------------------------------------------------------------------

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.template.get("resources", {})

    def of_type(self, type_: str) -> list[tuple[str, dict[str, Any]]]:
        return [(name, res) for name, res in self.resources.items() if res["type"] == type_]

    def one(self, type_: str) -> tuple[str, dict[str, Any]]:
        found = self.of_type(type_)
        assert len(found) == 1, f"expected exactly one `{type_}`, found {[n for n, _ in found]}"
        return found[0]

    def config(self, symbol: str) -> dict[str, Any]:
        return self.resources[symbol]["config"]

    def props(self, symbol: str) -> dict[str, Any]:
        return self.config(symbol).get("properties") or {}

    # values -------------------------------------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        """Follow a bare identifier to its variable value or parameter default, and
        ``var.key`` to a key of an object variable. Anything else is returned as is."""
        variables = self.template.get("variables", {})
        parameters = self.template.get("parameters", {})
        for _ in range(20):
            if isinstance(value, str) and value in variables:
                value = variables[value]["value"]
            elif isinstance(value, str) and value in parameters:
                if parameters[value]["default"] is None:
                    return value
                value = parameters[value]["default"]
            elif isinstance(value, dict) and "operator" in value:
                head, _, key = expr(value).partition(".")
                target = variables.get(head, {}).get("value")
                if not (isinstance(target, dict) and key in target):
                    return value
                value = target[key]
            else:
                return value
        raise AssertionError(f"cannot resolve {value!r}")

    def app_settings(self) -> dict[str, Any]:
        """The function app's settings: ``Microsoft.Web/sites/config`` ``appsettings`` of the
        site, and ``siteConfig.appSettings`` of the site itself."""
        site, _ = self.one("Microsoft.Web/sites")
        settings: dict[str, Any] = {}
        for item in self.props(site).get("siteConfig", {}).get("appSettings", []) or []:
            settings[self.resolve(item["name"])] = item["value"]
        for symbol, res in self.of_type("Microsoft.Web/sites/config"):
            cfg = res["config"]
            if cfg.get("parent") == site and self.resolve(cfg["name"]) == "appsettings":
                settings.update(self.props(symbol))
        assert settings, "the function app has no app settings"
        return settings

    def secure_parameters(self) -> set[str]:
        return {
            name
            for name, param in self.template.get("parameters", {}).items()
            if any(d["type"] == "secure" for d in param["decorators"])
        }


def parse_bicep(text: str) -> dict[str, Any]:
    return _PARSER.parse(text=text)


def load(
    *,
    bicep: str | None = None,
    parameters: str | None = None,
    azure_yaml: str | None = None,
    app_source: str | None = None,
) -> Infra:
    modules = {
        str(path.relative_to(INFRA)): parse_bicep(path.read_text())
        for path in sorted(INFRA.rglob("*.bicep"))
        if path != MAIN
    }
    return Infra(
        template=parse_bicep(MAIN.read_text() if bicep is None else bicep),
        parameters_file=json.loads(PARAMETERS.read_text() if parameters is None else parameters),
        azure_yaml=yaml.safe_load(AZURE_YAML.read_text() if azure_yaml is None else azure_yaml),
        app_source=app_source,
        modules=modules,
    )


# -- What the app reads ---------------------------------------------------------------------------


def _code_strings(source: str) -> Iterator[str]:
    """Every string literal of ``source`` that is code, not a docstring (or a comment)."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.value


def placeholders(source: str) -> set[str]:
    """The ``%NAME%`` app settings ``source`` refers to (the pattern the library resolves)."""
    return {name for text in _code_strings(source) for name in PLACEHOLDER.findall(text)}


#: Environment variables the platform sets itself: reading them needs no app setting.
PLATFORM_PREFIXES = ("WEBSITE_", "FUNCTIONS_", "CONTAINER_NAME")


def environment_reads(source: str) -> set[str]:
    """Names ``source`` reads directly: ``os.environ["X"]``, ``os.environ.get("X")``,
    ``os.getenv("X")``, less those the platform sets."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            called = ast.unparse(node.func)
            if called.endswith(("environ.get", "getenv")):
                key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return {name for name in names if not name.startswith(PLATFORM_PREFIXES)}


def settings_read(source: str) -> set[str]:
    """Every app setting ``source`` needs: its ``%NAME%`` placeholders and environment reads."""
    return placeholders(source) | environment_reads(source)


def storage_connections(source: str) -> set[str]:
    """The storage settings the app's state stores read: ``AzureWebJobsStorage`` (the default,
    and the host's own) and any ``connection=`` given to a Blob or Table store."""
    names = {DEFAULT_CONNECTION}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in {"BlobStateStore", "TableStateStore"}:
            continue
        args = [kw.value for kw in node.keywords if kw.arg == "connection"] + node.args[:1]
        names.update(a.value for a in args if isinstance(a, ast.Constant) and a.value)
    return names


class _RecordingCredential:
    """Stands in for ``ManagedIdentityCredential``: records how the code built it."""

    def __init__(self, *, client_id: str | None = None, **kwargs: Any) -> None:
        self.client_id = client_id

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("no token in this test")


def simulated_settings(infra: Infra) -> dict[str, str]:
    """The app settings as the app would see them, ARM expressions replaced by plausible
    values for the storage account's endpoints and the identity's client ID."""
    storage, _ = infra.one("Microsoft.Storage/storageAccounts")
    identity, _ = infra.one("Microsoft.ManagedIdentity/userAssignedIdentities")
    known = {
        f"{storage}.properties.primaryEndpoints.{service}": SIM_ENDPOINT.format(service=service)
        for service in ("blob", "queue", "table", "file", "dfs")
    }
    known[f"{storage}.name"] = "stsimulated"
    known[f"{identity}.properties.clientId"] = SIM_CLIENT_ID

    def value(node: Any) -> str:
        node = infra.resolve(node)
        if isinstance(node, dict):
            return known.get(expr(node), f"<{expr(node)}>")
        if isinstance(node, str):
            return re.sub(r"\$\{([^}]*)\}", lambda m: known.get(m[1], f"<{m[1]}>"), node)
        return json.dumps(node)

    return {name: value(node) for name, node in infra.app_settings().items()}


# -- The checks -----------------------------------------------------------------------------------


_KEY_PATTERNS = (
    re.compile(r"\blist\w*(?:keys|sas)\b", re.IGNORECASE),  # listKeys(), listAccountSas(), …
    re.compile(r"AccountKey\s*=", re.IGNORECASE),
    re.compile(r"SharedAccessSignature\s*=", re.IGNORECASE),
    re.compile(r"DefaultEndpointsProtocol\s*=", re.IGNORECASE),  # a key-based connection string
)


def check_no_keys(infra: Infra) -> None:
    """No account key, SAS or key-based connection string anywhere in the infra."""
    documents = {
        "main.bicep": infra.template,
        **infra.modules,
        "main.parameters.json": infra.parameters_file,
        "azure.yaml": infra.azure_yaml,
    }
    for name, document in documents.items():
        text = json.dumps(document)
        for pattern in _KEY_PATTERNS:
            match = pattern.search(text)
            assert match is None, f"{name} uses storage keys: `{match[0]}`"


def check_storage_refuses_shared_keys(infra: Infra) -> None:
    accounts = infra.of_type("Microsoft.Storage/storageAccounts")
    assert accounts, "no storage account"
    for symbol, _ in accounts:
        props = infra.props(symbol)
        assert infra.resolve(props.get("allowSharedKeyAccess")) is False, (
            f"storage account `{symbol}` must set allowSharedKeyAccess: false"
        )
        assert infra.resolve(props.get("allowBlobPublicAccess")) is False, (
            f"storage account `{symbol}` must set allowBlobPublicAccess: false"
        )


def check_flex_consumption(infra: Infra) -> None:
    plan, _ = infra.one("Microsoft.Web/serverfarms")
    sku = infra.config(plan)["sku"]
    got = (infra.resolve(sku["name"]), infra.resolve(sku["tier"]))
    assert got == ("FC1", "FlexConsumption"), f"plan SKU {got} is not Flex Consumption (FC1)"
    assert infra.resolve(infra.props(plan).get("reserved")) is True, "Flex Consumption is Linux"

    site, res = infra.one("Microsoft.Web/sites")
    # functionAppConfig exists from API version 2023-12-01 on.
    assert res["api_version"] >= "2023-12-01", res["api_version"]
    kind = infra.resolve(infra.config(site)["kind"]).split(",")
    assert set(kind) == {"functionapp", "linux"}, kind
    props = infra.props(site)
    assert expr(props["serverFarmId"]) == f"{plan}.id"

    app_config = props["functionAppConfig"]
    runtime = app_config["runtime"]
    assert infra.resolve(runtime["name"]) == "python", f"runtime {runtime['name']} is not python"
    version = infra.resolve(runtime["version"])
    allowed = [version]
    if isinstance(runtime["version"], str) and runtime["version"] in infra.template["parameters"]:
        decorators = infra.template["parameters"][runtime["version"]]["decorators"]
        allowed += [v for d in decorators if d["type"] == "allowed" for v in d["argument"]]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(p) for p in re.findall(r"\d+", requires)[:2])
    for candidate in allowed:
        assert candidate in FLEX_PYTHON, f"Python {candidate} is not offered on Flex Consumption"
        assert tuple(int(p) for p in candidate.split(".")) >= minimum, (
            f"Python {candidate} is below the package's requires-python {requires}"
        )

    scale = app_config["scaleAndConcurrency"]
    assert {"maximumInstanceCount", "instanceMemoryMB"} <= set(scale)

    # The deployment package lives in a container of the storage account, reached with identity.
    storage, _ = infra.one("Microsoft.Storage/storageAccounts")
    deployment = app_config["deployment"]["storage"]
    assert infra.resolve(deployment["type"]) == "blobContainer"
    match = re.fullmatch(
        rf"\$\{{{storage}\.properties\.primaryEndpoints\.blob\}}\$\{{(\w+)\}}",
        str(deployment["value"]),
    )
    assert match, f"deployment storage is not a container of `{storage}`: {deployment['value']}"
    containers = {
        infra.resolve(c["config"]["name"])
        for _, c in infra.of_type("Microsoft.Storage/storageAccounts/blobServices/containers")
    }
    assert infra.resolve(match[1]) in containers, "the deployment container is not created"


def check_one_user_assigned_identity(infra: Infra) -> None:
    """One user-assigned identity is named wherever the app picks an identity."""
    identity, _ = infra.one("Microsoft.ManagedIdentity/userAssignedIdentities")
    site, _ = infra.one("Microsoft.Web/sites")
    assigned = infra.config(site)["identity"]
    assert infra.resolve(assigned["type"]) == "UserAssigned", (
        f"the app's identity type is `{assigned['type']}`, not only UserAssigned"
    )
    keys = {key.strip("'") for key in assigned["userAssignedIdentities"]}
    assert keys == {f"${{{identity}.id}}"}, keys

    props = infra.props(site)
    assert expr(props.get("keyVaultReferenceIdentity")) == f"{identity}.id", (
        "keyVaultReferenceIdentity must name the user-assigned identity (without it, Key Vault "
        "references use a system-assigned identity the app does not have)"
    )
    auth = props["functionAppConfig"]["deployment"]["storage"]["authentication"]
    assert infra.resolve(auth["type"]) == "UserAssignedIdentity"
    assert expr(auth["userAssignedIdentityResourceId"]) == f"{identity}.id"

    settings = infra.app_settings()
    assert expr(settings.get("AzureWebJobsStorage__clientId")) == f"{identity}.properties.clientId"
    credential = infra.resolve(settings.get("AzureWebJobsStorage__credential"))
    assert str(credential).lower() == "managedidentity", credential
    assert infra.resolve(settings.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")) == (
        f"ClientId=${{{identity}.properties.clientId}};Authorization=AAD"
    )


def check_settings_the_code_reads(infra: Infra) -> None:
    """Every setting function_app.py reads is set, and the storage settings resolve — through the
    library's own resolve_storage — to identity-based Blob and Table endpoints of the account."""
    assert infra.app_source is not None
    settings = infra.app_settings()
    forbidden = sorted(FORBIDDEN_SETTINGS & settings.keys())
    assert not forbidden, f"app settings not allowed here: {forbidden}"

    missing = sorted(settings_read(infra.app_source) - settings.keys())
    assert not missing, f"function_app.py reads app settings the Bicep does not set: {missing}"

    # The host needs Blob and Queue endpoints for AzureWebJobsStorage.
    assert (
        "AzureWebJobsStorage__accountName" in settings
        or {
            "AzureWebJobsStorage__blobServiceUri",
            "AzureWebJobsStorage__queueServiceUri",
        }
        <= settings.keys()
    ), "the host needs AzureWebJobsStorage's blob and queue endpoints"

    env = simulated_settings(infra)
    for connection in sorted(storage_connections(infra.app_source)):
        assert connection not in settings, f"`{connection}` would be read as a connection string"
        with mock.patch("azure.identity.ManagedIdentityCredential", _RecordingCredential):
            try:
                target = resolve_storage(env, connection)
            except ConfigurationError as exc:
                raise AssertionError(f"the state store cannot use `{connection}`: {exc}") from exc
        assert target.connection_string is None
        assert target.blob_url == SIM_ENDPOINT.format(service="blob"), (
            f"`{connection}__blobServiceUri` must be the Blob endpoint of the storage account"
        )
        assert target.table_url == SIM_ENDPOINT.format(service="table"), (
            f"`{connection}__tableServiceUri` must be the Table endpoint of the storage account"
        )
        assert isinstance(target.credential, _RecordingCredential), (
            f"`{connection}__credential` must be `managedidentity`"
        )
        assert target.credential.client_id == SIM_CLIENT_ID, (
            f"`{connection}__clientId` must be the client ID of the app's identity"
        )


def check_monitoring(infra: Infra) -> None:
    components, _ = infra.one("Microsoft.Insights/components")
    workspace, _ = infra.one("Microsoft.OperationalInsights/workspaces")
    assert expr(infra.props(components).get("WorkspaceResourceId")) == f"{workspace}.id"
    settings = infra.app_settings()
    assert expr(settings.get("APPLICATIONINSIGHTS_CONNECTION_STRING")) == (
        f"{components}.properties.ConnectionString"
    ), "APPLICATIONINSIGHTS_CONNECTION_STRING must be the connection string of Application Insights"
    assert infra.props(components).get("DisableLocalAuth") is True, (
        "Application Insights must set DisableLocalAuth: true (Entra-authenticated telemetry only)"
    )


def check_role_assignments(infra: Infra) -> None:
    """Each role once, to the app's identity, at the right resource; the app settings wait."""
    identity, _ = infra.one("Microsoft.ManagedIdentity/userAssignedIdentities")
    found: dict[str, str] = {}
    operator: dict[str, str] = {}
    for symbol, res in infra.of_type("Microsoft.Authorization/roleAssignments"):
        cfg = res["config"]
        if "condition" in cfg:  # only the operator's roles are optional
            operator[check_operator_role(infra, symbol, cfg)] = symbol
            continue
        props = cfg["properties"]
        assert expr(props["principalId"]) == f"{identity}.properties.principalId", (
            f"role assignment `{symbol}` is not for the app's identity"
        )
        assert infra.resolve(props.get("principalType")) == "ServicePrincipal", symbol
        definition = props["roleDefinitionId"]["function"]
        assert definition["type"] == "subscription_resource_id", symbol
        params = definition["parameters"]
        assert params["resource_type"] == "Microsoft.Authorization/roleDefinitions", symbol
        role = infra.resolve(params["resource_name_1"])
        assert role in ROLES, f"`{symbol}` assigns an unexpected role `{role}`"
        role_name, scope_type = ROLES[role]
        assert role not in found, f"{role_name} is assigned twice"
        scope = cfg.get("scope")
        assert scope in infra.resources, f"`{symbol}` ({role_name}) has no resource scope"
        assert infra.resources[scope]["type"] == scope_type, (
            f"{role_name} must be scoped to a `{scope_type}`, not `{scope}`"
        )
        # A name unique per scope, principal and role, and stable across deployments.
        name = cfg["name"]["function"]
        assert name["type"] == "guid", symbol
        parts = [expr(p) for p in name["parameters"].values() if p is not None]
        assert f"{scope}.id" in parts, (symbol, parts)
        assert f"{identity}.id" in parts, (symbol, parts)
        found[role] = symbol
    missing = sorted(ROLES[r][0] for r in ROLES.keys() - found.keys())
    assert not missing, f"roles not assigned to the app's identity: {missing}"
    lacking = sorted(OPERATOR_ROLES[r] for r in OPERATOR_ROLES.keys() - operator.keys())
    assert not lacking, f"roles not given to the operator (principalId): {lacking}"

    # The Key Vault role is on the vault that holds the referenced secrets.
    vaults = {
        infra.config(s)["parent"] for s, _ in infra.of_type("Microsoft.KeyVault/vaults/secrets")
    }
    kv_scope = infra.config(found["4633458b-17de-408a-b874-0445c86b69e6"])["scope"]
    assert vaults <= {kv_scope}, f"secrets live in {vaults}, the role is on `{kv_scope}`"

    # The host starts as soon as the settings land: the roles must already exist.
    for symbol, res in infra.of_type("Microsoft.Web/sites/config"):
        depends = set(res["config"].get("dependsOn") or [])
        late = sorted(set(found.values()) - depends)
        assert not late, f"`{symbol}` does not wait for the role assignments {late}"


#: The operator's data-plane roles on the storage account (``principalId``), by id.
OPERATOR_ROLES = {
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
}


def check_operator_role(infra: Infra, symbol: str, outer: dict[str, Any]) -> str:
    """A role for ``principalId`` (the person running afdb against the deployed state): only
    when it is given, on the storage account, with a stable name. Returns the role id."""
    condition = outer["condition"]["operator"]
    assert condition["type"] == "not", f"`{symbol}` must be `if (!empty(principalId))`"
    test = condition["operands"]["bool_value"]["function"]
    assert test["type"] == "empty", symbol
    assert test["parameters"]["item_to_test"] == "principalId", symbol
    cfg = outer["config"]
    props = cfg["properties"]
    assert props["principalId"] == "principalId", f"`{symbol}` is not for principalId"
    assert props.get("principalType") == "principalType", symbol
    role = infra.resolve(props["roleDefinitionId"]["function"]["parameters"]["resource_name_1"])
    assert role in OPERATOR_ROLES, f"`{symbol}` gives the operator an unexpected role `{role}`"
    scope = cfg.get("scope")
    assert infra.resources.get(scope, {}).get("type") == "Microsoft.Storage/storageAccounts", (
        f"`{symbol}` must be scoped to the storage account"
    )
    parts = [expr(p) for p in cfg["name"]["function"]["parameters"].values() if p is not None]
    assert f"{scope}.id" in parts, (symbol, parts)
    assert "principalId" in parts, (symbol, parts)
    return str(role)


_KEY_VAULT_REFERENCE = re.compile(
    r"@Microsoft\.KeyVault\(SecretUri=\$\{(\w+)\.properties\.secretUri(?:WithVersion)?\}\)"
)


def check_key_vault_references(infra: Infra) -> None:
    """Each @secure() parameter is a Key Vault secret, referenced by an app setting."""
    settings = infra.app_settings()
    secure = infra.secure_parameters()
    assert secure, "the database URL must be a @secure() parameter"

    references: dict[str, str] = {}
    for name, node in settings.items():
        value = infra.resolve(node)
        if isinstance(value, dict):
            assert expr(value).split(".")[0] not in secure, f"`{name}` holds a secure value"
            continue
        text = str(value)
        for param in secure:
            assert f"${{{param}}}" not in text, f"`{name}` holds the secure `{param}`"
        if text.startswith("@Microsoft.KeyVault"):
            match = _KEY_VAULT_REFERENCE.fullmatch(text)
            assert match, f"`{name}` is not a SecretUri Key Vault reference: {text}"
            references[match[1]] = name
        else:
            assert text not in secure, f"`{name}` holds the secure `{text}` in plain text"

    for secret, res in infra.of_type("Microsoft.KeyVault/vaults/secrets"):
        value = res["config"]["properties"]["value"]
        assert value in secure, f"secret `{secret}` does not hold a secure parameter"
        assert secret in references, f"no app setting references the secret `{secret}`"
        vault = res["config"]["parent"]
        assert infra.resources[vault]["type"] == "Microsoft.KeyVault/vaults"
        assert infra.resolve(infra.props(vault).get("enableRbacAuthorization")) is True, (
            f"Key Vault `{vault}` must use Azure RBAC (enableRbacAuthorization: true)"
        )
    stored = {
        r["config"]["properties"]["value"]
        for _, r in infra.of_type("Microsoft.KeyVault/vaults/secrets")
    }
    assert stored == secure, f"secure parameters not stored in Key Vault: {sorted(secure - stored)}"
    for referenced in references:
        assert referenced in infra.resources, f"Key Vault reference to unknown `{referenced}`"
        assert infra.resources[referenced]["type"] == "Microsoft.KeyVault/vaults/secrets"

    outputs = json.dumps(infra.template.get("outputs", {}))
    for param in secure:
        assert not re.search(rf"\b{param}\b", outputs), f"an output exposes `{param}`"


def check_checkpoint_container(infra: Infra) -> None:
    """BlobStateStore's default container is created in the account the app's settings name."""
    default = inspect.signature(BlobStateStore).parameters["container"].default
    storage, _ = infra.one("Microsoft.Storage/storageAccounts")
    matches = [
        symbol
        for symbol, res in infra.of_type(
            "Microsoft.Storage/storageAccounts/blobServices/containers"
        )
        if infra.resolve(res["config"]["name"]) == default
    ]
    assert matches, f"no blob container `{default}` (BlobStateStore's default)"
    (symbol,) = matches
    service = infra.config(symbol)["parent"]
    assert infra.config(service)["parent"] == storage, f"`{default}` is not in `{storage}`"
    assert infra.resolve(infra.props(symbol).get("publicAccess", "None")) == "None"


def check_outputs(infra: Infra) -> None:
    outputs = infra.template.get("outputs", {})
    for name, type_ in OUTPUTS.items():
        symbol, _ = infra.one(type_)
        assert name in outputs, f"output `{name}` is missing"
        assert expr(outputs[name]["value"]) == f"{symbol}.name", (name, outputs[name]["value"])
    assert expr(outputs.get("AZURE_RESOURCE_GROUP", {}).get("value")) == "resource_group().name"
    assert "AZURE_LOCATION" in outputs
    default = inspect.signature(BlobStateStore).parameters["container"].default
    container = outputs.get("AFDB_STATE_CONTAINER", {}).get("value")
    assert container is not None, "output `AFDB_STATE_CONTAINER` is missing"
    symbol = expr(container).removesuffix(".name")
    assert infra.resolve(infra.config(symbol)["name"]) == default


def check_azure_yaml(infra: Infra) -> None:
    config = infra.azure_yaml
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", str(config.get("name")))
    provision = config.get("infra") or {}
    assert provision.get("provider", "bicep") == "bicep"
    module = ROOT / provision.get("path", "infra") / f"{provision.get('module', 'main')}.bicep"
    assert module == MAIN, module

    services = config.get("services") or {}
    assert set(services) == {"app"}, set(services)
    service = services["app"]
    assert service.get("host") == "function", f"service `app` is hosted on {service.get('host')}"
    assert service.get("language") in {"python", "py"}, service
    assert (ROOT / service.get("project", "")).resolve() == ROOT, (
        f"service `app` is the project at {service.get('project')}, not the repository root"
    )
    # requirements.txt installs the afdb wheel from dist/: azd must build it before packaging.
    hook = (service.get("hooks") or {}).get("prepackage") or {}
    assert hook.get("run") == "make wheel", f"service `app` has no `make wheel` prepackage: {hook}"

    # azd deploys the service to the resource tagged with its name.
    site, _ = infra.one("Microsoft.Web/sites")
    tags = infra.config(site).get("tags")
    if isinstance(tags, dict) and "function" in tags:
        pairs: dict[str, Any] = {}
        for node in tags["function"]["parameters"].values():
            arg = infra.resolve(node)
            if isinstance(arg, dict):
                pairs.update({k.strip("'"): v for k, v in arg.items()})
        tags = pairs
    assert isinstance(tags, dict)
    tag = {k.strip("'"): v for k, v in tags.items()}.get("azd-service-name")
    assert tag == "app", f"the function app is tagged azd-service-name={tag}, azd looks for `app`"


def check_parameters_file(infra: Infra) -> None:
    file = infra.parameters_file
    assert file.get("$schema", "").endswith("deploymentParameters.json#")
    assert "contentVersion" in file
    given = file.get("parameters", {})
    declared = infra.template.get("parameters", {})
    unknown = sorted(given.keys() - declared.keys())
    assert not unknown, f"main.parameters.json sets parameters main.bicep lacks: {unknown}"
    required = {name for name, param in declared.items() if param["default"] is None}
    missing = sorted(required - given.keys())
    assert not missing, f"main.parameters.json leaves required parameters out: {missing}"
    for name in infra.secure_parameters() & given.keys():
        value = given[name].get("value")
        assert isinstance(value, str), name
        assert re.fullmatch(r"\$\{\w+\}", value), (
            f"secure parameter `{name}` must come from the environment (`${{VAR}}`), not the file"
        )


CHECKS: dict[str, Callable[[Infra], None]] = {
    check.__name__: check
    for check in (
        check_no_keys,
        check_storage_refuses_shared_keys,
        check_flex_consumption,
        check_one_user_assigned_identity,
        check_settings_the_code_reads,
        check_monitoring,
        check_role_assignments,
        check_key_vault_references,
        check_checkpoint_container,
        check_outputs,
        check_azure_yaml,
        check_parameters_file,
    )
}

# -- Tests on the real files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def infra() -> Infra:
    return load()


def test_every_bicep_file_parses():
    files = sorted(INFRA.rglob("*.bicep"))
    assert MAIN in files
    parsed = {path: parse_bicep(path.read_text()) for path in files}
    assert parsed[MAIN]["resources"]


@pytest.mark.parametrize("name", [n for n in CHECKS if n != "check_settings_the_code_reads"])
def test_check(infra, name):
    CHECKS[name](infra)


def test_app_settings_cover_function_app(infra):
    if not FUNCTION_APP.exists():
        # Not "not applicable": in CI (CI=true) this skip fails the run, as it should.
        pytest.skip(f"{FUNCTION_APP.name} is missing: the app settings it reads cannot be checked")
    infra.app_source = FUNCTION_APP.read_text()
    check_settings_the_code_reads(infra)


# -- Mutants: each check can fail ------------------------------------------------------------------

#: A stand-in for function_app.py in the mutant tests, so they do not depend on the sample.
SAMPLE_APP = '''
"""Docstring mentioning %NOT_A_SETTING% is ignored."""
import azure_functions_db as afdb

db = afdb.PollerBlueprint()
SOURCE = afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id")
# %ALSO_NOT_A_SETTING% in a comment
'''


@dataclass(frozen=True)
class Mutant:
    id: str
    old: str
    new: str
    check: str
    says: str  # part of the check's failure message
    file: str = "bicep"  # or "parameters", "azure_yaml", "app"


MUTANTS = [
    Mutant(
        "app-insights-local-auth",
        "    DisableLocalAuth: true\n",
        "",
        "check_monitoring",
        "DisableLocalAuth",
    ),
    Mutant(
        "operator-role-unconditional",
        "resource operatorTableData 'Microsoft.Authorization/roleAssignments@2022-04-01' = if "
        "(!empty(principalId)) {",
        "resource operatorTableData 'Microsoft.Authorization/roleAssignments@2022-04-01' = {",
        "check_role_assignments",
        "not for the app's identity",
    ),
    Mutant(
        "operator-role-missing",
        "roles.storageTableDataContributor)\n    principalId: principalId\n",
        "roles.storageBlobDataContributor)\n    principalId: principalId\n",
        "check_role_assignments",
        "roles not given to the operator",
    ),
    Mutant(
        "operator-principal-type-fixed",
        "    principalId: principalId\n    principalType: principalType\n  }\n}\n\n"
        "// -- Function app",
        "    principalId: principalId\n    principalType: 'User'\n  }\n}\n\n// -- Function app",
        "check_role_assignments",
        "operatorTableData",
    ),
    Mutant(
        "listKeys",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n"
        "    STORAGE_KEY: storage.listKeys().keys[0].value\n",
        "check_no_keys",
        "uses storage keys: `listKeys`",
    ),
    Mutant(
        "account-key-connection-string",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n"
        "    OTHER: 'DefaultEndpointsProtocol=https;AccountName=${storage.name};AccountKey=x'\n",
        "check_no_keys",
        "uses storage keys: `AccountKey=`",
    ),
    Mutant(
        "shared-keys-on",
        "    allowSharedKeyAccess: false\n",
        "    allowSharedKeyAccess: true\n",
        "check_storage_refuses_shared_keys",
        "must set allowSharedKeyAccess: false",
    ),
    Mutant(
        "shared-keys-default",
        "    allowSharedKeyAccess: false\n",
        "",
        "check_storage_refuses_shared_keys",
        "must set allowSharedKeyAccess: false",
    ),
    Mutant(
        "consumption-sku",
        "name: 'FC1'",
        "name: 'Y1'",
        "check_flex_consumption",
        "is not Flex Consumption",
    ),
    Mutant(
        "dynamic-tier",
        "tier: 'FlexConsumption'",
        "tier: 'Dynamic'",
        "check_flex_consumption",
        "is not Flex Consumption",
    ),
    Mutant(
        "node-runtime",
        "name: 'python'",
        "name: 'node'",
        "check_flex_consumption",
        "is not python",
    ),
    Mutant(
        "python-3.13-not-on-flex",
        "  '3.12'\n])",
        "  '3.13'\n])",
        "check_flex_consumption",
        "Python 3.13 is not offered on Flex Consumption",
    ),
    Mutant(
        "python-below-requires-python",
        "param pythonVersion string = '3.11'",
        "param pythonVersion string = '3.10'",
        "check_flex_consumption",
        "Python 3.10 is below the package's requires-python",
    ),
    Mutant(
        "deployment-container-not-created",
        "          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'",
        "          value: '${storage.properties.primaryEndpoints.blob}${keyVaultName}'",
        "check_flex_consumption",
        "the deployment container is not created",
    ),
    Mutant(
        "no-key-vault-reference-identity",
        "    keyVaultReferenceIdentity: appIdentity.id\n",
        "",
        "check_one_user_assigned_identity",
        "keyVaultReferenceIdentity must name the user-assigned identity",
    ),
    Mutant(
        "system-assigned",
        "    type: 'UserAssigned'\n",
        "    type: 'SystemAssigned, UserAssigned'\n",
        "check_one_user_assigned_identity",
        "not only UserAssigned",
    ),
    Mutant(
        "client-id-is-principal-id",
        "AzureWebJobsStorage__clientId: appIdentity.properties.clientId",
        "AzureWebJobsStorage__clientId: appIdentity.properties.principalId",
        "check_settings_the_code_reads",
        "`AzureWebJobsStorage__clientId` must be the client ID",
    ),
    Mutant(
        "default-azure-credential",
        "AzureWebJobsStorage__credential: 'managedidentity'",
        "AzureWebJobsStorage__credential: 'default'",
        "check_settings_the_code_reads",
        "`AzureWebJobsStorage__credential` must be `managedidentity`",
    ),
    Mutant(
        "no-table-endpoint",
        "    AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table\n",
        "",
        "check_settings_the_code_reads",
        "`AzureWebJobsStorage__tableServiceUri` must be the Table endpoint",
    ),
    Mutant(
        "no-queue-endpoint",
        "    AzureWebJobsStorage__queueServiceUri: storage.properties.primaryEndpoints.queue\n",
        "",
        "check_settings_the_code_reads",
        "the host needs AzureWebJobsStorage's blob and queue endpoints",
    ),
    Mutant(
        "db-url-setting-renamed",
        "    ORDERS_DB_URL: '@Microsoft",
        "    ORDERS_DATABASE: '@Microsoft",
        "check_settings_the_code_reads",
        "does not set: ['ORDERS_DB_URL']",
    ),
    Mutant(
        "placeholder-not-set",
        'url="%ORDERS_DB_URL%"',
        'url="%ORDERS_DB_URL%", filter="region = %REGION%"',
        "check_settings_the_code_reads",
        "does not set: ['REGION']",
        file="app",
    ),
    Mutant(
        "environment-read-not-set",
        "# %ALSO_NOT_A_SETTING% in a comment\n",
        "# %ALSO_NOT_A_SETTING% in a comment\nAUDIT_URL = os.environ['AUDIT_DB_URL']\n",
        "check_settings_the_code_reads",
        "does not set: ['AUDIT_DB_URL']",
        file="app",
    ),
    Mutant(
        "state-store-on-another-connection",
        "# %ALSO_NOT_A_SETTING% in a comment\n",
        "# %ALSO_NOT_A_SETTING% in a comment\nSTATE = afdb.BlobStateStore(connection='STATE')\n",
        "check_settings_the_code_reads",
        "the state store cannot use `STATE`",
        file="app",
    ),
    Mutant(
        "connection-string-setting",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n"
        "    AzureWebJobsStorage: 'UseDevelopmentStorage=true'\n",
        "check_settings_the_code_reads",
        "app settings not allowed here: ['AzureWebJobsStorage']",
    ),
    Mutant(
        "worker-runtime-setting",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n",
        "    AzureWebJobsStorage__credential: 'managedidentity'\n"
        "    FUNCTIONS_WORKER_RUNTIME: 'python'\n",
        "check_settings_the_code_reads",
        "app settings not allowed here: ['FUNCTIONS_WORKER_RUNTIME']",
    ),
    Mutant(
        "no-app-insights-connection-string",
        "    APPLICATIONINSIGHTS_CONNECTION_STRING: appInsights.properties.ConnectionString\n",
        "",
        "check_monitoring",
        "APPLICATIONINSIGHTS_CONNECTION_STRING must be",
    ),
    Mutant(
        "table-role-is-blob-contributor",
        "storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'",
        "storageTableDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'",
        "check_role_assignments",
        "assigns an unexpected role `ba92f5b4",
    ),
    Mutant(
        "queue-role-on-key-vault",
        "  name: guid(storage.id, appIdentity.id, roles.storageQueueDataContributor)\n"
        "  scope: storage\n",
        "  name: guid(keyVault.id, appIdentity.id, roles.storageQueueDataContributor)\n"
        "  scope: keyVault\n",
        "check_role_assignments",
        "Storage Queue Data Contributor must be scoped to a `Microsoft.Storage/storageAccounts`",
    ),
    Mutant(
        "key-vault-role-on-storage",
        "  name: guid(keyVault.id, appIdentity.id, roles.keyVaultSecretsUser)\n  scope: keyVault\n",
        "  name: guid(storage.id, appIdentity.id, roles.keyVaultSecretsUser)\n  scope: storage\n",
        "check_role_assignments",
        "Key Vault Secrets User must be scoped to a `Microsoft.KeyVault/vaults`",
    ),
    Mutant(
        "role-for-another-principal",
        "  name: guid(storage.id, appIdentity.id, roles.storageBlobDataOwner)\n"
        "  scope: storage\n"
        "  properties: {\n"
        "    roleDefinitionId: subscriptionResourceId("
        "'Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)\n"
        "    principalId: appIdentity.properties.principalId\n",
        "  name: guid(storage.id, appIdentity.id, roles.storageBlobDataOwner)\n"
        "  scope: storage\n"
        "  properties: {\n"
        "    roleDefinitionId: subscriptionResourceId("
        "'Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)\n"
        "    principalId: deployer\n",
        "check_role_assignments",
        "is not for the app's identity",
    ),
    Mutant(
        "settings-do-not-wait-for-roles",
        "    keyVaultSecretsUser\n    monitoringMetricsPublisher\n  ]",
        "    monitoringMetricsPublisher\n  ]",
        "check_role_assignments",
        "does not wait for the role assignments ['keyVaultSecretsUser']",
    ),
    Mutant(
        "plain-secret-in-setting",
        "    ORDERS_DB_URL: '@Microsoft.KeyVault(",
        "    ORDERS_DB_URL: ordersDbUrl\n    UNUSED: '@Microsoft.KeyVault(",
        "check_key_vault_references",
        "`ORDERS_DB_URL` holds the secure `ordersDbUrl`",
    ),
    Mutant(
        "reference-to-the-vault-not-the-secret",
        "(SecretUri=${ordersDbUrlSecret.properties.secretUri})",
        "(SecretUri=${keyVault.properties.vaultUri})",
        "check_key_vault_references",
        "is not a SecretUri Key Vault reference",
    ),
    Mutant(
        "access-policies",
        "enableRbacAuthorization: true",
        "enableRbacAuthorization: false",
        "check_key_vault_references",
        "must use Azure RBAC",
    ),
    Mutant(
        "secret-in-output",
        "output AZURE_LOCATION string = location",
        "output AZURE_LOCATION string = location\noutput LEAK string = ordersDbUrl",
        "check_key_vault_references",
        "an output exposes `ordersDbUrl`",
    ),
    Mutant(
        "checkpoint-container-renamed",
        "var checkpointContainerName = 'afdb-state'",
        "var checkpointContainerName = 'afdb-checkpoints'",
        "check_checkpoint_container",
        "no blob container `afdb-state`",
    ),
    Mutant(
        "function-app-output-renamed",
        "output AZURE_FUNCTION_APP_NAME string",
        "output FUNCTION_APP_NAME string",
        "check_outputs",
        "output `AZURE_FUNCTION_APP_NAME` is missing",
    ),
    Mutant(
        "app-service-host",
        "host: function",
        "host: appservice",
        "check_azure_yaml",
        "hosted on appservice",
        file="azure_yaml",
    ),
    Mutant(
        "project-elsewhere",
        "project: .",
        "project: ./src",
        "check_azure_yaml",
        "not the repository root",
        file="azure_yaml",
    ),
    Mutant(
        "service-tag-mismatch",
        "'azd-service-name': 'app'",
        "'azd-service-name': 'api'",
        "check_azure_yaml",
        "azd-service-name=api",
    ),
    Mutant(
        "unknown-parameter",
        '"parameters": {\n',
        '"parameters": {\n    "locaton": {"value": "${AZURE_LOCATION}"},\n',
        "check_parameters_file",
        "main.bicep lacks: ['locaton']",
        file="parameters",
    ),
    Mutant(
        "secret-in-parameters-file",
        '"value": "${ORDERS_DB_URL}"',
        '"value": "postgresql://app:hunter2@db/orders"',
        "check_parameters_file",
        "must come from the environment",
        file="parameters",
    ),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_is_caught(mutant):
    texts = {
        "bicep": MAIN.read_text(),
        "parameters": PARAMETERS.read_text(),
        "azure_yaml": AZURE_YAML.read_text(),
        "app": SAMPLE_APP,
    }
    original = texts[mutant.file]
    assert original.count(mutant.old) == 1, f"mutant `{mutant.id}` no longer applies"
    texts[mutant.file] = original.replace(mutant.old, mutant.new)
    mutated = load(
        bicep=texts["bicep"],
        parameters=texts["parameters"],
        azure_yaml=texts["azure_yaml"],
        app_source=texts["app"],
    )
    # The unmutated files pass the same check with the stand-in app …
    CHECKS[mutant.check](load(app_source=SAMPLE_APP))
    # … and the mutant fails it.
    with pytest.raises(AssertionError, match=re.escape(mutant.says)):
        CHECKS[mutant.check](mutated)


def test_settings_read_by_an_app_source():
    assert placeholders(SAMPLE_APP) == {"ORDERS_DB_URL"}
    source = (
        'import os\nos.environ["A"]\nos.environ.get("B", "x")\nos.getenv("C")\n'
        'os.environ["WEBSITE_INSTANCE_ID"]\nx = "%D%/%E%"\n'
    )
    assert settings_read(source) == {"A", "B", "C", "D", "E"}
    source = 'afdb.BlobStateStore(connection="STATE")\nafdb.TableStateStore("OTHER")\n'
    assert storage_connections(source) == {"AzureWebJobsStorage", "STATE", "OTHER"}
