"""A tokenizer test double shared by the judge-stage tests: one id per character (`ord`), so a prompt's ids decode
back to its text exactly, and every call's keyword arguments are recorded for the tests to assert on."""


class CharTok:
    """One id per character; `encodes` records each call's `add_special_tokens`, `decodes` each
    `batch_decode`'s `skip_special_tokens`."""

    def __init__(self):
        self.encodes, self.decodes = [], []

    def __call__(self, text, add_special_tokens=True):
        self.encodes.append(add_special_tokens)
        return {"input_ids": [ord(c) for c in text]}

    def batch_decode(self, rows, skip_special_tokens=False):
        self.decodes.append(skip_special_tokens)
        return ["".join(chr(i) for i in row) for row in rows]
