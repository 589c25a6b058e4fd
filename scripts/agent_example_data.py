"""Writes the bundled agent example's data from examples/agent_tools.py's catalogue (the files are committed; run this
only to change them): `python scripts/agent_example_data.py`.

- examples/agent_catalogue.jsonl: 36 questions about the catalogue's first 36 items, with `answer` (the price);
- examples/agent_catalogue_eval.jsonl: 12 held-out questions about the other 12 items;
- examples/agent_warmup.jsonl: 24 tool-call demonstrations for a short SFT warm-up, with three other tools
  (weather, stock prices, town populations) and none of the catalogue: they show the call format and answering
  from a result; which tool this task needs, and which item to ask it for, is left to GRPO."""
from __future__ import annotations

import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from agent_tools import CATALOGUE  # noqa: E402

QUESTIONS = ("How many credits does the {} cost?", "What is the price of the {}?", "How much is the {}?")


def _tool(name: str, description: str, arg: str, arg_description: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {arg: {"type": "string", "description": arg_description}},
                       "required": [arg]}, "return": {"type": "string"}}}


WARMUP_TOOLS = [
    (_tool("get_weather", "Current temperature of a city in degrees Celsius.", "city", "The city's name."),
     "What is the temperature in {}?", "{}: {} degrees", "It is {1} degrees in {0}.", (-9, 39),
     ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Rome", "Quito", "Perth"]),
    (_tool("stock_price", "The last trade price of a stock in dollars.", "ticker", "The stock's ticker symbol."),
     "What does a share of {} cost?", "{}: {} dollars", "A share of {0} costs {1} dollars.", (12, 980),
     ["ACME", "BOLT", "CRUX", "DYNA", "ECHO", "FLUX", "GRID", "HALO"]),
    (_tool("population", "The number of people living in a town.", "town", "The town's name."),
     "How many people live in {}?", "{}: {} people", "{1} people live in {0}.", (300, 98000),
     ["Lindhaven", "Marrowby", "Northcote", "Ashwell", "Bramford", "Caldmoor", "Dunmere", "Eskdale"]),
]


def question_rows(names: list[str], offset: int = 0) -> list[dict]:
    return [{"prompt": QUESTIONS[(i + offset) % len(QUESTIONS)].format(n), "answer": CATALOGUE[n]}
            for i, n in enumerate(names)]


def warmup_rows(rng: random.Random) -> list[dict]:
    rows = []
    for tool, question, result, answer, (low, high), subjects in WARMUP_TOOLS:
        name, arg = tool["function"]["name"], next(iter(tool["function"]["parameters"]["properties"]))
        for s in subjects:
            value = rng.randint(low, high)
            call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": {arg: s}}}
            rows.append({"tools": [tool], "messages": [
                {"role": "user", "content": question.format(s)},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": result.format(s, value)},
                {"role": "assistant", "content": answer.format(s, value)}]})
    rng.shuffle(rows)
    return rows


def write(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"{path}: {len(rows)} rows")


def main() -> None:
    names = list(CATALOGUE)
    examples = os.path.join(ROOT, "examples")
    write(os.path.join(examples, "agent_catalogue.jsonl"), question_rows(names[:36]))
    write(os.path.join(examples, "agent_catalogue_eval.jsonl"), question_rows(names[36:], offset=1))
    write(os.path.join(examples, "agent_warmup.jsonl"), warmup_rows(random.Random(3)))


if __name__ == "__main__":
    main()
