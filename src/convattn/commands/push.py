"""`convattn push`: upload a saved run (weights, tokenizer, modeling code, model card) to the Hugging Face Hub."""

from __future__ import annotations

import argparse

from convattn.commands.arguments import user_path

NAME = "push"
HELP = "upload a saved run to the Hugging Face Hub"
DESCRIPTION = (
    "Write the run's model card (README.md) and upload the folder to a Hub model repository "
    "(created if needed; checkpoints/ and tensorboard/ stay local). The uploaded model loads "
    "with trust_remote_code=True where convattn is not installed. Log in first "
    "(`hf auth login`) or pass --token."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=user_path,
                        help="a folder written by convattn pretrain / glue / save_pretrained")
    parser.add_argument("--repo", required=True, help="the Hub repository, e.g. user/convattn-small-composite")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--token", default=None, help="a Hub token (default: the logged-in one)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from convattn.checkpoint import check_model_folder
    from convattn.errors import UsageError
    from convattn.hub import push

    if not args.run_dir.is_dir():
        raise UsageError(f"{args.run_dir} is not a folder: give the folder of a saved model")
    check_model_folder(args.run_dir, flag="run_dir", need_convattn="convattn push uploads convattn models")
    url = push(args.run_dir, args.repo, private=args.private, token=args.token)
    print(f"pushed {args.run_dir} to {args.repo}: {url}")
    return 0
