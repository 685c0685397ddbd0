from precompile.cli.main import run

run()
