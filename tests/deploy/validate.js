// Schema-checks Kubernetes manifests with the npm package kubernetes-models
// (its ajv validators follow the Kubernetes OpenAPI schema; unknown fields
// are accepted, wrong types, missing required fields and bad enums are not).
// Usage: NODE_PATH=DIR/node_modules node validate.js FILE.yaml...
// Prints one PASS/FAIL line per object; exits 1 if any object fails.
'use strict';
const fs = require('fs');
const yaml = require('js-yaml');

function modelFor(doc) {
  // kubernetes-models lays its classes out as <apiVersion>/<Kind>, with the
  // core group as plain "v1".
  const path = `kubernetes-models/${doc.apiVersion}/${doc.kind}`;
  try {
    return require(path)[doc.kind];
  } catch (e) {
    return null;
  }
}

let failed = 0;
for (const file of process.argv.slice(2)) {
  let docs;
  try {
    docs = yaml.loadAll(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    console.log(`FAIL ${file}: ${e.message}`);
    failed++;
    continue;
  }
  for (const doc of docs) {
    if (doc === null || doc === undefined) continue;
    const what = `${file}: ${doc.kind} ${doc.metadata && doc.metadata.name}`;
    const Model = doc.apiVersion && doc.kind ? modelFor(doc) : null;
    if (!Model) {
      console.log(`FAIL ${what}: no schema for ${doc.apiVersion} ${doc.kind}`);
      failed++;
      continue;
    }
    try {
      new Model(doc).validate();
      console.log(`PASS ${what}`);
    } catch (e) {
      console.log(`FAIL ${what}: ${e.message}`);
      failed++;
    }
  }
}
process.exit(failed ? 1 : 0);
