#!/usr/bin/env python3
"""sam-translate.py TEMPLATE — print the plain CloudFormation (JSON) that the
AWS::Serverless transform makes of TEMPLATE, offline, with aws-sam-translator.
Used by the template tests to assert the real wiring."""
import json
import os
import sys

try:
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator
    from samtranslator.yaml_helper import yaml_parse
except ImportError:
    sys.exit("sam-translate: aws-sam-translator is not installed (it ships with cfn-lint)")


class OfflinePolicies:
    """Resolves AWS managed policy names to ARNs without calling IAM."""

    def load(self):
        return {}


def main():
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(sys.argv[1]) as f:
        template = yaml_parse(f.read())
    # As `sam package` would: a local CodeUri becomes an S3 location.
    glob = template.get("Globals", {}).get("Function", {})
    if "CodeUri" in glob:
        glob["CodeUri"] = "s3://holdfast-artifacts/code.zip"
    for res in template.get("Resources", {}).values():
        if res.get("Type") == "AWS::Serverless::Function" and "CodeUri" in res.get("Properties", {}):
            res["Properties"]["CodeUri"] = "s3://holdfast-artifacts/code.zip"
    params = {"AWS::Region": "us-east-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws"}
    out = Translator(OfflinePolicies(), Parser()).translate(template, parameter_values=params)
    json.dump(out, sys.stdout, indent=1, sort_keys=True, default=str)


main()
