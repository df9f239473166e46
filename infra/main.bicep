// Azure resources for the sample app (function_app.py): a Python function app on the Flex
// Consumption plan whose pollers keep their leases and checkpoints in Blob storage.
//
// Deploy with `azd up` (azure.yaml at the repository root), or with
//   az deployment group create -g <group> -f infra/main.bicep -p infra/main.parameters.json \
//     -p environmentName=<name> ordersDbUrl=<database URL>
// See docs/deploy.md ("Provision and deploy").
//
// Security model, checked by tests/test_infra.py:
// - The storage account refuses shared keys (allowSharedKeyAccess: false). Nothing here reads an
//   account key (no listKeys()) or writes a connection string with a key: the host and the
//   library reach storage with the app's managed identity through the AzureWebJobsStorage__*
//   settings.
// - One user-assigned identity is the app's identity for everything: host storage, the pollers'
//   state store, the deployment package, Key Vault references and Application Insights.
// - The database URL is a Key Vault secret; the app setting only holds a Key Vault reference.

targetScope = 'resourceGroup'

// -- Parameters -----------------------------------------------------------------------------------

@minLength(1)
@maxLength(64)
@description('Name of the environment (azd: AZURE_ENV_NAME). Seeds the resource names and tags every resource with azd-env-name.')
param environmentName string

@minLength(1)
@description('Region for every resource. Must be one that offers Flex Consumption: az functionapp list-flexconsumption-locations.')
param location string = resourceGroup().location

@secure()
@minLength(1)
@description('Database URL of the orders poller, SQLAlchemy form (postgresql+psycopg://user:password@host/db). Stored only as a Key Vault secret.')
param ordersDbUrl string

// Flex Consumption supports Python 3.10, 3.11 and 3.12 (Microsoft Learn, "Flex Consumption plan
// hosting", supported language stack versions). The package needs Python >= 3.11, so 3.10 is left
// out. 3.11 is the default: the version the project is developed and tested on.
@allowed([
  '3.11'
  '3.12'
])
@description('Python version of the function app (functionAppConfig.runtime.version).')
param pythonVersion string = '3.11'

// A timer function runs on one instance at a time (the host's singleton lock), and the poller's
// blob lease keeps a second run of the same poller out anyway, so the smallest allowed ceiling is
// plenty.
@minValue(40)
@maxValue(1000)
@description('Most instances the app may scale out to.')
param maximumInstanceCount int = 40

@allowed([
  2048
  4096
])
@description('Memory of each instance in MB.')
param instanceMemoryMB int = 2048

@description('Object id of the person (or group) who operates the pollers: Storage Blob and Table Data Contributor on the storage account, so `afdb status`, `afdb seek` and `afdb quarantine --state azure` reach the deployed state with their own Entra sign-in. azd fills it with the signed-in user. Empty: no one.')
param principalId string = ''

@description('What principalId is: a User, a Group or a ServicePrincipal.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param principalType string = 'User'

// -- Names ----------------------------------------------------------------------------------------

// uniqueString() gives 13 lowercase letters and digits, stable for a group and environment.
var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = 'func-${resourceToken}'
var storageAccountName = 'st${resourceToken}'
var keyVaultName = 'kv-${resourceToken}'

// The container the Flex Consumption platform deploys the app's package to.
var deploymentContainerName = 'app-package-${take(resourceToken, 7)}'
// BlobStateStore's default container (azure_functions_db/state/blob.py). The store creates it on
// first use anyway; provisioning it makes it part of the template (private, visible to
// `afdb status` and the portal before the first run).
var checkpointContainerName = 'afdb-state'
var ordersDbUrlSecretName = 'orders-db-url'

// Built-in role definitions (Microsoft Learn, "Azure built-in roles"). The IDs are the same in
// every tenant.
var roles = {
  // The role Microsoft documents for a host's identity-based AzureWebJobsStorage (its blobs and
  // timer locks); it also covers the deployment package and the pollers' lease and checkpoint
  // blobs (BlobStateStore needs at least Storage Blob Data Contributor).
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  // Queues: part of the roles Microsoft documents for a host's identity-based AzureWebJobsStorage.
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  // Tables: afdb.TableStateStore keeps its checkpoints there.
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  // The operator's data-plane access to the pollers' state (`afdb status/seek/quarantine`).
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  // Read secret contents: needed to resolve the Key Vault reference of ORDERS_DB_URL.
  keyVaultSecretsUser: '4633458b-17de-408a-b874-0445c86b69e6'
  // Send telemetry to Application Insights with Microsoft Entra authentication.
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}

// -- Identity -------------------------------------------------------------------------------------

// User-assigned rather than system-assigned: it exists before the function app, so its role
// assignments are in place (the app settings depend on them) before the host first starts, and
// the Flex deployment storage can authenticate with it. Using it requires naming it wherever an
// identity is chosen: AzureWebJobsStorage__clientId, keyVaultReferenceIdentity,
// APPLICATIONINSIGHTS_AUTHENTICATION_STRING and the deployment storage authentication.
resource appIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${resourceToken}'
  location: location
  tags: tags
}

// -- Monitoring -----------------------------------------------------------------------------------

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: 'log-${resourceToken}'
  location: location
  tags: tags
  properties: {
    retentionInDays: 30
    sku: {
      name: 'PerGB2018'
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: 'appi-${resourceToken}'
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    // Telemetry only with Microsoft Entra authentication (the identity's Monitoring Metrics
    // Publisher role); no instrumentation-key ingestion.
    DisableLocalAuth: true
  }
}

// -- Storage --------------------------------------------------------------------------------------

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    // No account keys: every client (the host, the state stores, the deployment) authenticates
    // with Microsoft Entra ID.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource checkpointContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: checkpointContainerName
  properties: {
    publicAccess: 'None'
  }
}

// -- Key Vault ------------------------------------------------------------------------------------

resource keyVault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: keyVaultName
  location: location
  tags: tags
  properties: {
    tenantId: tenant().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    // Access by Azure RBAC roles, not access policies.
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    publicNetworkAccess: 'Enabled'
  }
}

resource ordersDbUrlSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  parent: keyVault
  name: ordersDbUrlSecretName
  properties: {
    value: ordersDbUrl
    contentType: 'text/plain'
  }
}

// -- Role assignments for the app's identity ------------------------------------------------------

resource storageBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appIdentity.id, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: appIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource storageQueueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appIdentity.id, roles.storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: appIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource storageTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appIdentity.id, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: appIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource keyVaultSecretsUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(keyVault.id, appIdentity.id, roles.keyVaultSecretsUser)
  scope: keyVault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.keyVaultSecretsUser)
    principalId: appIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource monitoringMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, appIdentity.id, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: appIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// -- Role assignments for the operator (optional) ------------------------------------------------

resource operatorBlobData 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  name: guid(storage.id, principalId, roles.storageBlobDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    principalId: principalId
    principalType: principalType
  }
}

resource operatorTableData 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  name: guid(storage.id, principalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: principalId
    principalType: principalType
  }
}

// -- Function app ---------------------------------------------------------------------------------

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: 'plan-${resourceToken}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true // Linux
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: functionAppName
  location: location
  // azd deploys the `app` service of azure.yaml to the resource with this tag.
  tags: union(tags, {
    'azd-service-name': 'app'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${appIdentity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // Resolve @Microsoft.KeyVault(...) app settings with this identity, not a system one.
    keyVaultReferenceIdentity: appIdentity.id
    siteConfig: {
      minTlsVersion: '1.2'
    }
    // Flex Consumption keeps the runtime, scale and deployment source here, not in app settings
    // (FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION must not be set on Flex).
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: appIdentity.id
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: pythonVersion
      }
    }
  }
  dependsOn: [
    deploymentContainer
    storageBlobDataOwner
  ]
}

// Every app setting of the app: this resource replaces the whole set on each deployment.
resource appSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'appsettings'
  properties: {
    // Host storage and the pollers' default state store (BlobStateStore, or TableStateStore),
    // identity-based: `AzureWebJobsStorage` itself is deliberately NOT set, because a value
    // there is taken as a connection string and every __ setting is then ignored.
    AzureWebJobsStorage__blobServiceUri: storage.properties.primaryEndpoints.blob
    AzureWebJobsStorage__queueServiceUri: storage.properties.primaryEndpoints.queue
    AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table
    AzureWebJobsStorage__credential: 'managedidentity'
    AzureWebJobsStorage__clientId: appIdentity.properties.clientId

    // The connection string of Application Insights names the resource; it holds no storage key.
    APPLICATIONINSIGHTS_CONNECTION_STRING: appInsights.properties.ConnectionString
    APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${appIdentity.properties.clientId};Authorization=AAD'

    // %ORDERS_DB_URL% in function_app.py: resolved by the platform from Key Vault with the
    // identity named by keyVaultReferenceIdentity. The versionless URI follows secret rotation.
    ORDERS_DB_URL: '@Microsoft.KeyVault(SecretUri=${ordersDbUrlSecret.properties.secretUri})'
  }
  // The roles must exist before the host and the Key Vault reference use the identity.
  dependsOn: [
    checkpointContainer
    storageBlobDataOwner
    storageQueueDataContributor
    storageTableDataContributor
    keyVaultSecretsUser
    monitoringMetricsPublisher
  ]
}

// -- Outputs (azd stores them in .azure/<environment>/.env) ---------------------------------------

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output AZURE_FUNCTION_APP_NAME string = functionApp.name
output AZURE_FUNCTION_APP_URL string = 'https://${functionApp.properties.defaultHostName}'
output AZURE_STORAGE_ACCOUNT_NAME string = storage.name
output AZURE_STORAGE_BLOB_ENDPOINT string = storage.properties.primaryEndpoints.blob
output AFDB_STATE_CONTAINER string = checkpointContainer.name
output AZURE_KEY_VAULT_NAME string = keyVault.name
output AZURE_KEY_VAULT_ENDPOINT string = keyVault.properties.vaultUri
output AZURE_APP_IDENTITY_NAME string = appIdentity.name
output AZURE_APP_IDENTITY_CLIENT_ID string = appIdentity.properties.clientId
output AZURE_APP_IDENTITY_PRINCIPAL_ID string = appIdentity.properties.principalId
output APPLICATIONINSIGHTS_NAME string = appInsights.name
